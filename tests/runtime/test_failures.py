"""Failures end runs cleanly: root causes are named, server processes never outlive their parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from telescope.core.runtime.errors import describe_failure, root_cause


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
    child_code = "from telescope.core.inference.parent_watch import exit_with_parent\nimport time\n" \
                 "exit_with_parent(0.2)\ntime.sleep(60)\n"  # fmt: skip
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
