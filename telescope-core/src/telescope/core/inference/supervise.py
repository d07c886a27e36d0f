"""Run a server command that cannot watch its parent itself (``vllm serve``), and end it with the parent.

    python -m telescope.core.inference.supervise [--interval S] [--grace S] -- ARGV...

The supervisor starts ``ARGV`` as its child in its own process group (``ServerProcess`` gives
the supervisor a new session, so a normal stop signals both), polls its own parent, and when
that parent is gone (a ``kill -9`` of the run, a crashed Ray actor) sends SIGTERM to the group,
then SIGKILL after ``--grace`` seconds: a GPU server never outlives the run that started it.
It exits with the child's exit code (128 + N when a signal N ended the child).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

__all__ = ["main", "supervised_argv"]


def supervised_argv(argv: list[str], interval_s: float = 1.0, grace_s: float = 10.0) -> list[str]:
    """``argv`` wrapped in this supervisor (same interpreter)."""
    return [
        sys.executable,
        "-m",
        "telescope.core.inference.supervise",
        "--interval",
        str(interval_s),
        "--grace",
        str(grace_s),
        "--",
        *argv,
    ]


def _end_group(child: subprocess.Popen[bytes], grace_s: float) -> int:
    """SIGTERM the process group, SIGKILL it after ``grace_s``; the child's exit code.

    The whole group: vLLM's own helper processes (engine core, TP workers) are in it too.
    """
    group = os.getpgrp()
    os.killpg(group, signal.SIGTERM)  # reaches this process too: ignored below
    try:
        return child.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(group, signal.SIGKILL)  # this process included: nobody is left to read the code
        return child.wait()


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="telescope.core.inference.supervise", description=__doc__)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between parent checks")
    parser.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="-- then the command to run")
    ns = parser.parse_args(args)
    argv = ns.argv[1:] if ns.argv[:1] == ["--"] else ns.argv
    if not argv:
        parser.error("no command given: put it after --, e.g. -- vllm serve MODEL")
    parent = os.getppid()
    # A stop of the whole group (ServerProcess.stop) reaches the child directly; the supervisor
    # stays to collect its exit code instead of dying first. Set before the child starts (a stop
    # right after the start killed the supervisor), as a handler, not SIG_IGN: exec resets a
    # handler to the default, while an ignored SIGTERM would be inherited by the server.
    signal.signal(signal.SIGTERM, _stay)
    child = subprocess.Popen(argv)
    while child.poll() is None:
        if os.getppid() != parent:
            return _exit_code(_end_group(child, ns.grace))
        try:
            child.wait(ns.interval)
        except subprocess.TimeoutExpired:
            pass
    return _exit_code(child.returncode)


def _stay(signum: int, frame: object) -> None:
    """SIGTERM to the supervisor: keep running until the child (signalled with it) has ended."""


def _exit_code(returncode: int) -> int:
    """The child's code; a child killed by signal N gives 128 + N, as a shell reports it."""
    return 128 - returncode if returncode < 0 else returncode


if __name__ == "__main__":
    sys.exit(main())
