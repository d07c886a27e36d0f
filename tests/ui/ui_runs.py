"""Run directories for the dashboard tests, written by our own loggers (LoggerHub + LocalLogger)
or, for damaged and old layouts, by hand."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zstandard

from telescope.core.observe import LoggerHub, RolloutRecord, rollout_metrics
from telescope.core.observe.loggers.local import LocalLogger
from telescope.core.testing import discarded_rows, kept_group_rows, make_config

#: Rewards of the two kept groups of every step (group 1's last sample depends on the step).
GROUP_REWARDS = {0: [1.0, 0.0, 0.0, 1.0], 1: [0.5, 0.0, 0.25, None]}


def step_rows(step: int) -> list[RolloutRecord]:
    """Two kept groups of 4, one max_async discard pair, one cancelled rollout."""
    rows = []
    for gid, rewards in GROUP_REWARDS.items():
        rs = [r if r is not None else step / 10 for r in rewards]
        rows += kept_group_rows(
            step,
            gid,
            rs,
            lambda i, r, gid=gid: {
                "prompt_text": f"<|im_start|>user\nreverse word{gid}<|im_end|>\n<|im_start|>assistant\n",
                "completion_text": f'drow{gid}-{i} <tool_call>{{"n": {i}}}</tool_call>',
                "completion_ids": list(range(4 + i)),
                "sample_metrics": {"correct": float(r > 0.4)},
            },
        )
    rows += discarded_rows(step, 2, "max_async", 2, prompt_ids=[1], completion_ids=[7] * 3, reward=1.0)
    rows += discarded_rows(step, 3, "off_policy")
    return rows


def start_hub(run_dir: Path, clock: Callable[[], float] = time.time, **cfg_fields: Any) -> LoggerHub:
    cfg_fields = {"number_of_steps": 4, **cfg_fields}
    cfg = make_config(wandb_run_name="uitest", use_wandb=False, **cfg_fields)
    hub = LoggerHub([LocalLogger(clock=clock)])
    hub.start(cfg, run_dir, system_metrics=False, ticker=False)
    hub.log_info(
        {
            "environments": [
                {
                    "name": "reverse_text",
                    "reward_min": 0.0,
                    "reward_max": 1.0,
                    "metrics_ranges": {"correct": {"min": 0.0, "max": 1.0}},
                }
            ]
        }
    )
    return hub


def log_step(hub: LoggerHub, step: int) -> None:
    rows = step_rows(step)
    hub.event("generation", "start", step=step, group_id=0, sample_id=0, server=0, lane=0)
    hub.event("generation", "end", step=step, group_id=0, sample_id=0, server=0, lane=0)
    hub.event("reward", "start", step=step, group_id=0, sample_id=0)
    hub.event("reward", "end", step=step, group_id=0, sample_id=0)
    with hub.span("trainer", name="train_step", step=step):
        pass
    hub.log_rollouts(step, rows)
    metrics = rollout_metrics(rows)
    metrics.update(
        {
            "entropy": 1.0 / step,
            "debug/grads/layer_norm": float(step),
            "timing_forward_total": 0.5,
            "timing_backward_total": 0.25,
        }
    )
    hub.log_step(step, metrics)


def write_run(run_dir: Path, steps: int = 4, *, finish: bool = True) -> LoggerHub:
    hub = start_hub(run_dir)
    for step in range(1, steps + 1):
        log_step(hub, step)
        if step % 2 == 0:
            rows = [{"prompt": f"q{i}", "completion": f"a{i}", "reward": float(i % 2)} for i in range(3)]
            hub.log_eval(step, "math", {"pass@1": step / 10, "pass^2": step / 20}, rows)
    if finish:
        hub.finish("finished")
    return hub


def append_frame(path: Path, *records: dict[str, Any], raw: bytes = b"", cut: int | None = None) -> bytes:
    """Append one zstd frame (made by zstandard itself, with a checksum) of ``records`` as JSONL lines,
    then ``raw`` lines; ``cut``: only its first ``cut`` bytes, as a writer killed mid-frame leaves
    it. Returns the whole frame."""
    text = "".join(json.dumps(r) + "\n" for r in records).encode() + raw
    frame = zstandard.ZstdCompressor(write_checksum=True).compress(text)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        f.write(frame if cut is None else frame[:cut])
    return frame


def append_jsonl(path: Path, *records: dict[str, Any], torn: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec) + "\n")
        f.write(torn)
