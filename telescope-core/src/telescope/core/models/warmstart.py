"""Supervised warm start of a demo model on its task's own solutions.

A randomly initialised model cannot solve anything, so RL would have no signal to amplify.
A short supervised pass gives it a partial skill that RL then improves (the quickstart's
reward climbs from there). Label smoothing leaves that skill under-confident: the model
knows more than it samples at temperature 1 (greedy decoding scores well above sampling),
so GRPO has a gain it reliably finds within a demo's 100 steps, by sharpening the policy
the way RL turns an LLM's pass@k into pass@1. Deterministic for a given seed.

``warm_start`` trains on any task given as an ``Example`` function (one prompt and its
solution per call); ``warm_start_reverse`` is it on reverse_text, the built-in models' task.
Other tasks' examples live with their environments' users (the health bench's countdown and
wordle models: tests/health/task_models.py), so this package never imports an environment.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from telescope.core.models.demo_tasks import REVERSE_SYSTEM_PROMPT, reverse_phrase

__all__ = ["Example", "reverse_example", "reverse_prompt_ids", "warm_start", "warm_start_reverse"]

Example = Callable[[Any, random.Random], tuple[list[int], str]]
"""``(tokenizer, rng) -> (prompt ids, solution text)``: one training example, drawn with ``rng``
(the solution is the assistant's answer; the warm start appends the EOS token)."""


def reverse_prompt_ids(tokenizer: Any, text: str) -> list[int]:
    """The prompt ids reverse_text sends for ``text`` (system prompt + user turn + generation prompt)."""
    messages = [{"role": "system", "content": REVERSE_SYSTEM_PROMPT}, {"role": "user", "content": text}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer.encode(rendered, add_special_tokens=False))


def reverse_example(tokenizer: Any, rng: random.Random) -> tuple[list[int], str]:
    """A reverse_text prompt of one to three demo words and its answer (the text reversed)."""
    text = reverse_phrase(rng, 1, 3)
    return reverse_prompt_ids(tokenizer, text), text[::-1]


def _batch(
    tokenizer: Any, rng: random.Random, size: int, eos_id: int, example: Example = reverse_example
) -> tuple[Any, Any]:
    import torch

    pairs = []
    for _ in range(size):
        prompt, solution = example(tokenizer, rng)
        pairs.append((prompt, list(tokenizer.encode(solution, add_special_tokens=False)) + [eos_id]))
    width = max(len(p) + len(a) for p, a in pairs)
    ids = torch.full((size, width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((size, width), -100, dtype=torch.long)
    for row, (prompt, answer) in enumerate(pairs):
        ids[row, : len(prompt) + len(answer)] = torch.tensor(prompt + answer)
        labels[row, len(prompt) : len(prompt) + len(answer)] = torch.tensor(answer)
    return ids, labels


def warm_start(
    model: Any,
    tokenizer: Any,
    example: Example,
    *,
    steps: int,
    seed: int,
    lr: float = 3e-3,
    label_smoothing: float = 0.0,
) -> float:
    """Train ``model`` in place for ``steps`` AdamW steps of 16 ``example``s (cross-entropy on the
    solution tokens with ``label_smoothing``); returns the last loss."""
    import torch
    import torch.nn.functional as F

    rng = random.Random(f"warm-start:{seed}")
    eos_id = int(tokenizer.convert_tokens_to_ids(tokenizer.eos_token))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    loss = torch.tensor(float("nan"))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for _ in range(steps):
            ids, labels = _batch(tokenizer, rng, 16, eos_id, example)
            logits = model(input_ids=ids).logits[:, :-1]  # position t predicts token t + 1
            loss = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]),
                labels[:, 1:].reshape(-1),
                ignore_index=-100,
                label_smoothing=label_smoothing,
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    return float(loss.detach())


def warm_start_reverse(
    model: Any, tokenizer: Any, *, steps: int, seed: int, lr: float = 3e-3, label_smoothing: float = 0.0
) -> float:
    """``warm_start`` on reverse_text (the built-in ``telescope/tiny-reverse``)."""
    return warm_start(
        model, tokenizer, reverse_example, steps=steps, seed=seed, lr=lr, label_smoothing=label_smoothing
    )
