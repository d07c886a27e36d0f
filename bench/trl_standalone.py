"""A plain TRL ``GRPOTrainer`` run, as a user would write it: the reference bench/vs_trl.py checks itself against.

Run: ``python bench/trl_standalone.py --model-dir DIR --prompts prompts.jsonl --max-tokens 16 --steps 19 --out r.json``

Imports only TRL, transformers, datasets and torch (no Telescope, no harness wrappers around
``generate``): the step time it prints is what TRL costs on its own, in its own process. Same
settings as bench/vs_trl.py's TRL run: 4 prompts x 8 completions per step, lr 1e-3 constant,
temperature 1, fp32, no KL term, 2 torch threads, gradient checkpointing off (a tiny CPU model
has nothing to gain from recomputing activations). The reward is the reverse_text LCS ratio,
copied here (Hyyrö's bit-parallel LCS, as ``telescope.envs.lcs``). The step time is the
median interval between ``on_step_end`` callbacks after ``--warmup`` steps; the whole
``train()`` wall time divided by the step count is written too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any


def lcs_length(a: str, b: str) -> int:
    if len(a) > len(b):
        a, b = b, a
    if not a:
        return 0
    masks: dict[str, int] = {}
    for i, ch in enumerate(a):
        masks[ch] = masks.get(ch, 0) | (1 << i)
    full = (1 << len(a)) - 1
    v = full
    for ch in b:
        u = v & masks.get(ch, 0)
        v = ((v + u) | (v - u)) & full
    return len(a) - bin(v).count("1")


def reward(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
    out = []
    for c, a in zip(completions, answer, strict=True):
        text = c[0]["content"]
        idx = text.rfind("</think>")
        text = (text if idx < 0 else text[idx + len("</think>") :]).strip()
        out.append(1.0 if not text and not a else 2.0 * lcs_length(text, a) / (len(text) + len(a)))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", required=True)
    p.add_argument("--prompts", required=True, help="jsonl rows {prompt: [messages], answer: str}")
    p.add_argument("--max-tokens", type=int, required=True)
    p.add_argument("--steps", type=int, required=True, help="all steps, warm-up included")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", required=True)
    a = p.parse_args()

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(a.threads)
    stamps: list[float] = []

    class StepClock(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
            stamps.append(time.perf_counter())

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            stamps.append(time.perf_counter())

    rows = [json.loads(line) for line in Path(a.prompts).read_text().splitlines()]
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=torch.float32),
        reward_funcs=reward,
        args=GRPOConfig(
            output_dir=str(Path(a.out).with_suffix(".trl")),
            use_cpu=True,
            bf16=False,
            per_device_train_batch_size=32,
            num_generations=8,
            max_completion_length=a.max_tokens,
            learning_rate=1e-3,
            lr_scheduler_type="constant",
            temperature=1.0,
            beta=0.0,
            max_steps=a.steps,
            gradient_checkpointing=False,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            disable_tqdm=True,
            seed=0,
        ),
        train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(a.model_dir),
        callbacks=[StepClock()],
    )
    t0 = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - t0
    steps = [b - x for x, b in zip(stamps[:-1], stamps[1:], strict=True)][a.warmup :]
    every = [h for h in trainer.state.log_history if "completions/mean_length" in h]
    logged = every[a.warmup :]
    result = {
        "step_s": steps,
        "median": statistics.median(steps),
        "train_s_per_step": total / a.steps,
        "completion_tokens": statistics.mean(h["completions/mean_length"] for h in logged),
        "step_tokens": [h["completions/mean_length"] for h in every],
    }
    Path(a.out).write_text(json.dumps(result))
    print(f"TRL standalone: {result['median']:.3f} s/step (median of {len(steps)})")


if __name__ == "__main__":
    main()
