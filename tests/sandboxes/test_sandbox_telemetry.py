"""Every provider call is a span (create, upload, execute, destroy) with the sandbox's settings and
what a command did; a step's spans become timeline events and ``sandbox/*`` metrics; the local
provider measures the CPU time its commands use."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from test_infra_errors import ScriptedProvider

from telescope.core import infra
from telescope.core.runtime.sandbox_report import METRICS, drain, percentile, sandbox_metrics
from telescope.core.sandbox import ExecResult, SandboxConfig, SandboxNotRunningError
from telescope.core.sandbox.telemetry import SPANS, SandboxSpan


def test_each_call_is_a_span_with_the_sandboxes_settings_and_the_commands_outcome() -> None:
    provider = ScriptedProvider()
    SPANS.drain()

    async def go() -> None:
        infra.attributed_to("code")
        async with provider.sandbox(SandboxConfig(memory_mb=256, cpu=2)) as box:
            await provider.upload_bytes(box, "a.py", b"print(1)")
            await provider.execute(box, "python3 a.py " + "x" * 300)
            provider.fail["execute"] = SandboxNotRunningError("gone")
            with pytest.raises(SandboxNotRunningError):
                await provider.execute(box, "true")

    asyncio.run(go())
    spans = SPANS.drain()
    assert [s.action for s in spans] == ["create", "upload", "execute", "execute", "destroy"]
    create, upload, ok, lost, destroy = spans
    assert len({s.sandbox_id for s in spans}) == 1 and all(
        s.provider == "scripted" and s.env == "code" for s in spans
    )
    assert (create.attrs["memory_mb"], create.attrs["cpu"], create.attrs["image"]) == (256, 2.0, "(default)")
    assert upload.attrs["bytes"] == 8 and upload.attrs["path"] == "a.py"
    assert ok.attrs["command"].endswith("...") and len(ok.attrs["command"]) == 203  # cut at 200
    assert (
        ok.attrs["oom"] is True and ok.attrs["exit_code"] is None
    )  # ScriptedProvider: limit_exceeded=memory
    assert lost.failed == "SandboxNotRunningError" and lost.attrs["infra_cause"] == "sandbox_lost"
    assert all(s.end >= s.start for s in spans) and destroy.failed is None


def span(action: str, start: float, end: float, **attrs: Any) -> SandboxSpan:
    return SandboxSpan(action, "s", "p", start, end, "e", attrs.pop("failed", None), attrs)


def test_a_steps_metrics_from_its_spans_against_hand_counted_values() -> None:
    spans = [
        span("create", 0, 1.0),
        span("create", 0, 3.0),
        span("create", 0, 9.0, failed="SandboxError", infra_cause="sandbox_create"),
        span("execute", 0, 0, duration_s=2.0, exit_code=0, cpu_s=1.5),
        span("execute", 0, 0, duration_s=4.0, exit_code=1, cpu_s=0.5),
        span("execute", 0, 0, duration_s=6.0, exit_code=None, timed_out=True, cpu_s=2.0),
        span("execute", 0, 0, duration_s=8.0, exit_code=None, oom=True, cpu_s=0.0),
    ]
    m = sandbox_metrics(spans, samples=2)
    assert (m["sandbox/creates"], m["sandbox/create_to_ready_p50_s"], m["sandbox/create_to_ready_p95_s"]) == (
        2.0,
        1.0,
        3.0,
    )
    assert (m["sandbox/exec_p50_s"], m["sandbox/exec_p95_s"]) == (4.0, 8.0)  # nearest rank of 2, 4, 6, 8
    assert (m["sandbox/timeouts"], m["sandbox/oom_kills"], m["sandbox/nonzero_exits"]) == (1.0, 1.0, 1.0)
    assert m["sandbox/infra_errors"] == 1.0 and m["sandbox/cpu_s_per_sample"] == 2.0  # 4 CPU s / 2 samples
    assert percentile([], 0.5) == 0.0 and percentile([5.0], 0.95) == 5.0
    unmeasured = sandbox_metrics([span("execute", 0, 1, duration_s=1.0, exit_code=0)], samples=1)
    assert "sandbox/cpu_s_per_sample" not in unmeasured  # not measured is not 0 CPU seconds


def test_a_figure_nothing_measured_is_left_out_never_zero() -> None:
    """A step without a create has no create-to-ready figure, one without a finished command no
    command time, and one where any command's CPU went unmeasured (bubblewrap, no cgroup) no CPU
    seconds: each is absent (the chart's gap, "not measured" on the page), not a 0."""
    partly = [
        span("execute", 0, 1, duration_s=1.0, exit_code=0, cpu_s=3.0),
        span("execute", 0, 1, duration_s=3.0, exit_code=0),  # this one's CPU: unknown
    ]
    m = sandbox_metrics(partly, samples=1)
    assert "sandbox/cpu_s_per_sample" not in m  # 3.0 would claim the unmeasured command used none
    assert "sandbox/create_to_ready_p50_s" not in m and "sandbox/create_to_ready_p95_s" not in m
    assert (m["sandbox/creates"], m["sandbox/exec_p50_s"], m["sandbox/exec_p95_s"]) == (0.0, 1.0, 3.0)
    lost = sandbox_metrics([span("execute", 0, 1, failed="SandboxNotRunningError")], samples=1)
    assert "sandbox/exec_p50_s" not in lost and "sandbox/cpu_s_per_sample" not in lost
    assert lost["sandbox/execs"] == 1.0 and set(m) | set(lost) <= set(METRICS)


def test_drained_spans_become_start_and_end_events_at_their_times() -> None:
    SPANS.drain()
    SPANS.add(span("execute", 10.0, 12.5, command="ls", exit_code=0, duration_s=2.5))
    events: list[Any] = []
    metrics = drain(events.append, step=3, samples=1)
    assert [(e.type, e.phase, e.name, e.time, e.step) for e in events] == [
        ("sandbox", "start", "execute", 10.0, 3),
        ("sandbox", "end", "execute", 12.5, 3),
    ]
    assert events[0].attrs["command"] == "ls" and events[0].attrs["sandbox_id"] == "s"
    assert metrics["sandbox/execs"] == 1.0 and drain(events.append, 4, 1) == {}  # nothing since


def test_a_sandbox_cgroup_gives_the_cpu_time_and_memory_peak_of_a_command(tmp_path: Path) -> None:
    from telescope.sandboxes.local._cgroup import SandboxCgroup
    from telescope.sandboxes.local._usage import CommandUsage, measured

    cgroup = SandboxCgroup(str(tmp_path))  # its files as the kernel writes them (a fake kernel)
    (tmp_path / "cpu.stat").write_text("usage_usec 1000000\nuser_usec 800000\nsystem_usec 200000\n")
    usage = CommandUsage.begin(cgroup, reaped_here=False)
    assert usage is not None
    (tmp_path / "cpu.stat").write_text("usage_usec 3500000\nuser_usec 3000000\nsystem_usec 500000\n")
    (tmp_path / "memory.peak").write_text("73400320\n")
    result = measured(usage, ExecResult(exit_code=0, stdout="", stderr=""))
    assert (result.cpu_s, result.memory_peak_bytes) == (2.5, 73400320)
    bare = ExecResult(exit_code=0, stdout="", stderr="")  # bubblewrap, no cgroup: nothing measured
    assert measured(CommandUsage.begin(None, reaped_here=False), bare) is bare


def test_a_command_reaped_here_reports_its_cpu_time_from_rusage() -> None:
    import subprocess

    from telescope.sandboxes.local._usage import CommandUsage, measured

    usage = CommandUsage.begin(None, reaped_here=True)
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import time; t = time.process_time()\nwhile time.process_time() - t < 0.4: pass",
        ],
        check=True,
    )
    result = measured(usage, ExecResult(exit_code=0, stdout="", stderr=""))
    assert result.cpu_s is not None and result.cpu_s >= 0.35 and result.memory_peak_bytes is None
