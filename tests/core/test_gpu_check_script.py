"""scripts/gpu-check.sh: what it runs (dry run, anywhere) and its refusal without a CUDA device."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120)


def test_dry_run_lists_every_step_and_writes_a_report(tmp_path: Path) -> None:
    report = tmp_path / "report.md"
    result = _run("--dry-run", str(report))
    assert result.returncode == 0, result.stderr
    planned = [line.removeprefix("would run: ").split() for line in result.stdout.splitlines()]
    assert [p[1:] for p in planned] == [
        ["-m", "pytest", "-q", "-m", "gpu", "--run-slow", "tests", "--ignore=tests/megatron"],
        ["-m", "pytest", "-q", "-m", "gpu", "--run-slow", "tests/megatron"],
        ["bench/trainer.py", "--gpu"],
        ["bench/inference.py"],
        ["bench/weight_sync.py"],
        ["bench/gpu_sync.py"],
        ["bench/vllm_smoke.py"],
    ]
    for step in planned:  # the benchmarks it names exist
        assert step[1] == "-m" or (ROOT / step[1]).is_file(), step
    text = report.read_text()
    assert text.count("\n## ") == 7 and "not run (dry run)" in text


def test_without_cuda_it_refuses_and_says_where_to_run_it(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the script would run for real")
    result = _run(str(tmp_path / "report.md"))
    assert result.returncode == 2 and "no CUDA device" in result.stderr
    assert not (tmp_path / "report.md").exists()


@pytest.mark.slow
def test_the_gpu_sync_check_rehearses_its_sync_on_cpu() -> None:
    """bench/gpu_sync.py's two processes, verification and equality check, over gloo on CPU (on a GPU
    machine the same code runs NCCL or the CUDA staging path)."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_sync.py"), "--cpu-rehearsal", "--mb", "4", "--reps", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "| CPU rehearsal sync, 8 MiB | verified |" in result.stdout
