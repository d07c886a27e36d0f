"""Failures end runs cleanly: root causes are named, server processes never outlive their parent."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

from telescope.core.errors import describe_failure, root_cause


class FakeRayTaskError(RuntimeError):
    def __init__(self, cause: BaseException) -> None:
        super().__init__("ray::TrainerWorker.train_step() (pid=1)\n  File ...\n  long remote traceback")
        self.cause = cause


def test_root_cause_unwraps_ray_and_chained_errors() -> None:
    original = ValueError("TrainSample.loss_mask has 3 values but completion_ids has 4 tokens")
    try:
        try:
            raise FakeRayTaskError(original)
        except FakeRayTaskError as exc:
            raise RuntimeError("step 3 failed") from exc
    except RuntimeError as outer:
        assert root_cause(outer) is original
        assert describe_failure(outer) == f"ValueError: {original}"


def test_server_process_exits_when_its_parent_is_killed() -> None:
    child_code = (
        "from telescope.core.inference.parent_watch import exit_with_parent\nimport time\n"
        "exit_with_parent(0.2)\ntime.sleep(60)\n"
    )
    parent_code = textwrap.dedent(f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", {child_code!r}], start_new_session=True)
        print(child.pid, flush=True)
        time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    child_pid = int(parent.stdout.readline())  # type: ignore[union-attr]
    time.sleep(1.0)
    os.kill(child_pid, 0)  # alive while the parent lives
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.time() + 5
    while time.time() < deadline:
        try:
            os.kill(child_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(child_pid, signal.SIGKILL)
    raise AssertionError("the child outlived its killed parent")


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as fh:
        return [int(p) for p in fh.read().split()]


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.time() + within_s
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_a_supervised_server_ends_with_its_launcher() -> None:
    # What the vllm engine launches: vllm serve (here a sleeper that ignores nothing) under the
    # supervisor, in its own session, from a launcher that is then killed with SIGKILL.
    parent_code = textwrap.dedent("""
        import subprocess, sys, time
        from telescope.core.inference.supervise import supervised_argv
        argv = supervised_argv([sys.executable, "-c", "import time; time.sleep(60)"], interval_s=0.2, grace_s=2)
        sup = subprocess.Popen(argv, start_new_session=True)
        print(sup.pid, flush=True)
        time.sleep(60)
    """)
    launcher = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    supervisor = int(launcher.stdout.readline())  # type: ignore[union-attr]
    deadline = time.time() + 10
    while not _children(supervisor) and time.time() < deadline:
        time.sleep(0.1)
    (server,) = _children(supervisor)
    assert not _gone(server, 0.5)  # alive while the launcher lives
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    try:
        assert _gone(server, 5) and _gone(supervisor, 5), "the server outlived its killed launcher"
    finally:
        for pid in (server, supervisor):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_supervised_server_that_ignores_sigterm_is_killed_with_its_helpers() -> None:
    # vllm serve has helper processes (engine core, TP workers); none may survive the escalation.
    stubborn = (
        "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "h = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)']); print(h.pid, flush=True); "
        "time.sleep(60)"
    )
    parent_code = textwrap.dedent(f"""
        import subprocess, sys, time
        from telescope.core.inference.supervise import supervised_argv
        argv = supervised_argv([sys.executable, "-c", {stubborn!r}], interval_s=0.2, grace_s=1)
        sup = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.PIPE, text=True)
        print(sup.pid, sup.stdout.readline().strip(), flush=True)
        time.sleep(60)
    """)
    launcher = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    supervisor, helper = (int(x) for x in launcher.stdout.readline().split())  # type: ignore[union-attr]
    (server,) = _children(supervisor)
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    try:
        assert all(_gone(pid, 6) for pid in (server, helper, supervisor)), (
            "a process survived SIGKILL escalation"
        )
    finally:
        for pid in (server, helper, supervisor):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_supervised_server_returns_its_exit_code_and_stops_with_its_group() -> None:
    from telescope.core.inference.supervise import supervised_argv

    done = subprocess.run(supervised_argv([sys.executable, "-c", "raise SystemExit(7)"]), timeout=30)
    assert done.returncode == 7
    # ServerProcess.stop: SIGTERM to the whole group ends the server; the supervisor reports it
    sup = subprocess.Popen(
        supervised_argv([sys.executable, "-c", "import time; time.sleep(60)"]), start_new_session=True
    )
    deadline = time.time() + 10
    while not _children(sup.pid) and time.time() < deadline:
        time.sleep(0.1)
    os.killpg(sup.pid, signal.SIGTERM)
    assert sup.wait(10) == 128 + signal.SIGTERM


def test_launch_refuses_a_port_already_in_use() -> None:
    import socket

    import pytest

    from telescope.core.inference.launcher import check_port_free

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"port {port} .* already in use"):
            check_port_free(f"http://127.0.0.1:{port}")
    check_port_free(f"http://127.0.0.1:{port}")  # free again: no error
