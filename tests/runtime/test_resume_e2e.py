"""Checkpoint and resume end to end on Ray (1 FSDP rank, 1 transformers server, CPU).

- Exact resume: with ``max_async_rollout: 0``, 6 steps in one go and 3 steps + resume + 3
  steps train on the same samples with the same losses.
- kill -9 of the whole training process (async on), then resume: the run completes, and the
  records prove no prompt was lost or trained twice.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from ports import free_port_block
from rundriver import launch as _launch
from rundriver import settings as driver_settings
from rundriver import wait_for as _wait_for

from telescope.core.config import load_config
from telescope.core.observe import RunDirReader
from telescope.core.plugins import load_plugins

pytest.importorskip("ray")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def settings(run_dir: Path, **overrides: Any) -> dict[str, Any]:
    return driver_settings(run_dir, **{"max_async_rollout": 0, "max_tokens": 10, "seq_len": 512, **overrides})


def train(run_dir: Path, **overrides: Any) -> None:
    from telescope.core.runtime import run_training

    pset, registry = load_plugins()
    assert run_training(load_config(None, settings(run_dir, **overrides), registry), pset, registry) == 0


def steps_by_number(run_dir: Path) -> dict[int, dict[str, float]]:
    """Step metrics; a step written twice (before and after a resume) keeps the later record."""
    out = {}
    for row in read_jsonl(run_dir / "metrics.jsonl"):
        out[int(row["step"])] = row.get("metrics", row)
    return out


def samples_by_step(run_dir: Path, after: float = 0.0) -> dict[int, list[tuple[int, int, tuple[int, ...]]]]:
    out: dict[int, list[tuple[int, int, tuple[int, ...]]]] = {}
    for r in RunDirReader(run_dir).rollouts():
        if r.get("discard_reason") is None and r["timings"].get("generation_start", after) >= after:
            out.setdefault(int(r["step"]), []).append(
                (r["group_id"], r["sample_id"], tuple(r["completion_ids"]))
            )
    return {step: sorted(rows) for step, rows in out.items()}


LORA = [0, pytest.param(4, marks=pytest.mark.slow, id="lora")]  # the LoRA mode resumes as exactly


@pytest.mark.parametrize("lora_rank", LORA)
def test_three_plus_three_steps_equal_six(tmp_path: Path, lora_rank: int) -> None:
    whole, split = tmp_path / "whole", tmp_path / "split"
    lr = {"lora_rank": lora_rank, "learning_rate": 1e-2} if lora_rank else {}  # adapters must move visibly
    train(whole, number_of_steps=6, checkpoint_every=3, **lr)
    train(split, number_of_steps=3, checkpoint_every=3, **lr)
    assert (split / "checkpoints" / "step_3").is_dir()
    train(split, number_of_steps=6, checkpoint_every=3, resume_from_checkpoint=True, **lr)
    if lora_rank:  # adapter-only syncs and checkpoints
        # 2 layers x 7 linear layers (q k v o gate up down) x (lora_A, lora_B), nothing else
        assert {m["weight_sync/num_tensors"] for m in steps_by_number(split).values()} == {28.0}
        assert (
            json.loads((split / "checkpoints" / "step_3" / "trainer_meta.json").read_text())["lora"]["r"]
            == lora_rank
        )

    a, b = steps_by_number(whole), steps_by_number(split)
    assert sorted(a) == sorted(b) == [1, 2, 3, 4, 5, 6]
    for step in range(1, 7):
        assert b[step]["loss"] == pytest.approx(a[step]["loss"], abs=1e-6), step
    sa, sb = samples_by_step(whole), samples_by_step(split)
    for step in range(4, 7):  # the resumed steps: same prompts, same sampled tokens
        assert sb[step] == sa[step], f"step {step} trained on different samples after the resume"
    state = json.loads((split / "checkpoints" / "step_6" / "orchestrator_state.json").read_text())
    assert state["counts"]["completed_steps"] == 6


@pytest.mark.parametrize("lora_rank", LORA)
def test_kill_minus_nine_then_resume_loses_and_repeats_nothing(tmp_path: Path, lora_rank: int) -> None:
    from telescope.core.rollouts.scheduler import PromptScheduler, SourceEnv

    run_dir, log = tmp_path / "run", tmp_path / "train.log"
    fields = settings(
        run_dir,
        number_of_steps=6,
        checkpoint_every=2,
        max_async_rollout=2,
        max_off_policy_steps=100,
        lora_rank=lora_rank,
    )
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(fields))
    proc = _launch(config, log)
    ckpt = run_dir / "checkpoints" / "step_2"

    def past_checkpoint() -> bool:
        metrics = run_dir / "metrics.jsonl"
        return ckpt.is_dir() and metrics.is_file() and len(read_jsonl(metrics)) >= 3

    _wait_for(past_checkpoint, proc, log, timeout_s=240)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    resume_from = max(int(p.name.split("_")[1]) for p in (run_dir / "checkpoints").glob("step_*"))
    resumed_at = time.time()
    config.write_text(
        yaml.safe_dump({**fields, "resume_from_checkpoint": True, "inference_base_port": free_port_block(1)})
    )
    proc = _launch(config, log)
    assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]

    steps = steps_by_number(run_dir)
    assert sorted(steps) == [1, 2, 3, 4, 5, 6]
    ids = json.loads((run_dir / "checkpoints" / f"step_{resume_from}" / "loggers.json").read_text())
    assert ids["local"]["run_id"] == json.loads((run_dir / "run.json").read_text())["run_id"]
    before = {s: rows for s, rows in samples_by_step(run_dir).items() if s <= resume_from}
    after = samples_by_step(run_dir, after=resumed_at)
    assert sorted(after) == list(range(resume_from + 1, 7))
    history = {**before, **after}
    trained = sorted({gid for rows in history.values() for gid, _, _ in rows})
    per_step = [{gid for gid, _, _ in rows} for rows in history.values()]
    assert sum(len(s) for s in per_step) == len(trained), "a prompt was trained at two steps"
    final = json.loads((run_dir / "checkpoints" / "step_6" / "orchestrator_state.json").read_text())
    pending = [i["group_id"] for i in final["prompts"]["outstanding"]]
    assert not set(pending) & set(trained)
    used = sorted(trained + pending)
    assert used == list(range(len(used))), "a drawn prompt was never trained nor kept for later"
    # The group ids name exactly the prompts an independent replay of the scheduler gives.
    replay = PromptScheduler([SourceEnv("reverse_text", 1.0, _dataset_size())], 5)
    expected = [replay.next().sample_idx for _ in range(len(used))]
    rows = RunDirReader(run_dir).rollouts()
    assert all(expected[r["group_id"]] == r["prompt_idx"] for r in rows if r["group_id"] < len(expected))


def _dataset_size() -> int:
    from telescope.core.env.resolve import create_environment

    _, registry = load_plugins()
    return len(create_environment(registry, "reverse_text", {}).samples())
