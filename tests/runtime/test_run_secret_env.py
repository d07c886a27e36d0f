"""The run's secret reaches every process of the run through its environment, never a command line."""

from __future__ import annotations

import pytest

from telescope.core.cluster import run_secret
from telescope.core.runtime.cluster import runtime_env

from ..inference.conftest import make_cfg


def test_ray_workers_get_the_drivers_secret_in_their_env_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    """A private cluster's workers inherit the driver's environment; those of a cluster started with
    ``ray start`` (another environment) get it only through the job's runtime_env."""
    monkeypatch.delenv(run_secret.ENV_VAR, raising=False)
    cfg = make_cfg(ray_runtime_env={"env_vars": {"MINE": "1", run_secret.ENV_VAR: "stale"}})
    env = runtime_env(cfg, "/tmp/run")
    secret = run_secret.current_run_secret()  # made by runtime_env, kept in this process
    assert env["env_vars"][run_secret.ENV_VAR] == secret != "stale"
    assert env["env_vars"]["MINE"] == "1"
    assert runtime_env(cfg, "/tmp/run")["env_vars"][run_secret.ENV_VAR] == secret  # one per run


def test_a_launched_server_inherits_the_secret_and_never_sees_it_as_an_argument(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    import sys

    from telescope.core.inference.launcher import ServerCommand, ServerProcess

    monkeypatch.delenv(run_secret.ENV_VAR, raising=False)
    out = tmp_path / "env.txt"
    code = f"import os, sys; open({str(out)!r}, 'w').write(os.environ.get({run_secret.ENV_VAR!r}, '') + '|' + ' '.join(sys.argv))"
    command = ServerCommand(argv=[sys.executable, "-c", code], env={}, url="http://127.0.0.1:9")
    server = ServerProcess(command, tmp_path / "server.log")
    server.process.wait(30)
    server.stop()
    secret, argv = out.read_text().split("|")
    assert secret == run_secret.current_run_secret() and len(secret) == 64
    assert secret not in argv
