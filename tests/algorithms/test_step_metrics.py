"""``StepMetrics``: combining micro-batches and ranks (a real two-process gloo all-reduce)."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys

import pytest
import torch

from telescope.core.algorithms import StepMetrics


def _micro_batch_metrics(rank: int, index: int) -> dict[str, torch.Tensor]:
    tokens = float(3 + rank + index)
    return {
        "loss_tokens": torch.tensor(tokens),
        "loss": torch.tensor(0.1 * (rank + 1)),
        "entropy_sum": torch.tensor(tokens * (1.0 + rank)),
        "x_sum": torch.tensor(tokens * (index - rank)),
        "x_min": torch.tensor(float(index - rank)),
        "x_max": torch.tensor(float(index - rank)),
    }


def test_token_weighted_means_min_and_max() -> None:
    acc = StepMetrics()
    acc.add({"loss_tokens": 2.0, "x_sum": 2.0, "a_min": 1.0, "a_max": 1.0, "loss": 0.25})
    acc.add({"loss_tokens": 6.0, "x_sum": 18.0, "a_min": -4.0, "a_max": -4.0, "loss": 0.5})
    out = acc.result()
    # x is 1 on 2 tokens and 3 on 6 tokens: token mean 2.5 (a mean of the two means would be 2).
    assert out == {"loss_tokens": 8.0, "x": 2.5, "a_min": -4.0, "a_max": 1.0, "loss": 0.75}


def test_no_loss_tokens_reports_counts_only() -> None:
    acc = StepMetrics()
    acc.add({"loss_tokens": 0.0, "x_sum": 0.0, "a_min": math.inf, "a_max": -math.inf})
    assert acc.result() == {"loss_tokens": 0.0}


_WORKER = """
import json, sys, torch, torch.distributed as dist
sys.path.insert(0, sys.argv[3])
from test_step_metrics import _micro_batch_metrics
from telescope.core.algorithms import StepMetrics
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=rank, world_size=2)
acc = StepMetrics()
for index in range(2 + rank):
    acc.add(_micro_batch_metrics(rank, index))
acc.all_reduce()
print(json.dumps(acc.result()))
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_all_reduce_across_two_ranks_equals_one_process() -> None:
    expected = StepMetrics()
    for rank in range(2):
        for index in range(2 + rank):
            expected.add(_micro_batch_metrics(rank, index))
    want = expected.result()
    assert want["x"] != 0 and want["x_min"] == -1.0 and want["x_max"] == 1.0

    port, here = str(_free_port()), os.path.dirname(os.path.abspath(__file__))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(r), port, here], stdout=subprocess.PIPE, text=True
        )
        for r in range(2)
    ]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    for text in outputs:
        got = json.loads(text.strip().splitlines()[-1])
        assert got.keys() == want.keys()
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-6), key
