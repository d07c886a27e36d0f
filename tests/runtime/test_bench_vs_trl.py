"""bench/vs_trl.py's process hygiene and report, and bench/trl_standalone.py's reward (no TRL run)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import pytest

# A child that ignores SIGTERM, as a stuck Ray daemon would: only SIGKILL ends it.
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"


def spawn(env_extra: dict[str, str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", STUBBORN], env={**os.environ, **env_extra}, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"  # its handler is installed
    return proc


def test_reap_kills_only_the_processes_carrying_this_runs_tag(bench_script: Any) -> None:
    bench = bench_script("vs_trl")
    ours = spawn({bench.TAG_VAR: "vs-trl-test-1"})
    other = spawn({bench.TAG_VAR: "vs-trl-else-1"})  # another invocation's run: never touched
    try:
        names = bench.tagged("vs-trl-test")
        assert set(names) == {ours.pid}
        assert bench.reap("vs-trl-test", grace_s=0.2) == [f"{ours.pid} {names[ours.pid]}"]
        assert ours.wait(timeout=10) == -9  # SIGTERM was ignored: SIGKILL ended it
        assert other.poll() is None and bench.tagged("vs-trl-test") == {}
        assert bench.reap("vs-trl-test", grace_s=0.2) == []  # nothing left: returns at once
    finally:
        for p in (ours, other):
            p.kill()
            p.wait()


def test_reap_waits_for_processes_that_end_by_themselves(bench_script: Any) -> None:
    bench = bench_script("vs_trl")
    env = {**os.environ, bench.TAG_VAR: "vs-trl-quick-1"}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"], env=env)
    started = time.monotonic()
    try:
        assert bench.reap("vs-trl-quick", grace_s=20.0) == []
        assert time.monotonic() - started < 10  # did not sit out the grace period
    finally:
        proc.wait()


def result(bench: Any, step_s: float, tokens: float = 10.0) -> Any:
    return bench.RunResult([step_s, step_s], load=1.0, completion_tokens=tokens, shortest=1, longest=16)


def test_table_compares_telescope_with_the_faster_trl_figure_and_shows_the_gap(
    bench_script: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = bench_script("vs_trl")
    by = {
        "trl-standalone": [result(bench, 0.1)],
        "trl": [result(bench, 0.2)],  # the harness twice as slow as TRL alone: the gap column says 2.00x
        "trl-defaults": [result(bench, 0.3)],
        "sync": [result(bench, 0.4)],
        "async": [result(bench, 0.05)],
    }
    bench.print_table("t", bench.median_of, {"tiny": 350_000}, {"tiny": by})
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| tiny"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:8] == ["0.100", "0.200", "2.00x", "0.300", "0.400", "0.050"]
    assert cells[8] == "2.00x (async)"  # 0.1 (standalone, the faster TRL) / 0.05
    assert cells[9:12] == ["3200", "6400", "2.00x"]  # 32 x 10 tokens / s


def test_standalone_reward_matches_reverse_text(bench_script: Any) -> None:
    from telescope.envs.reverse_text import reverse_reward

    standalone = bench_script("trl_standalone")
    cases = [("olleh", "olleh"), ("oll", "olleh"), ("", "abc"), ("<think>x</think> cba ", "cba"), ("", "")]
    got = standalone.reward([[{"content": c}] for c, _ in cases], [a for _, a in cases])
    assert got == [reverse_reward(c, a) for c, a in cases]
