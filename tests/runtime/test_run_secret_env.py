"""The run's secret reaches every process of the run through its environment, never a command line nor
Ray's runtime_env."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from telescope.core.cluster import run_secret
from telescope.core.runtime.cluster import runtime_env

from ..inference.conftest import make_cfg


def test_ray_workers_get_only_the_name_of_the_secret_and_the_hook_that_reads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ray writes the job's runtime_env in clear to its logs: the secret is not in it, not even one the
    user put in ``ray_runtime_env`` (the workers get the run's own from the key-value store); the
    user's setup hook still runs, after Telescope's (real clusters: below)."""
    monkeypatch.setenv(run_secret.ENV_VAR, "rs-" + "1" * 40)
    hook = "mypkg.setup.configure"
    cfg = make_cfg(
        ray_runtime_env={
            "env_vars": {"MINE": "1", run_secret.ENV_VAR: "stale"},
            "worker_process_setup_hook": hook,
        }
    )
    env = runtime_env(cfg, "/tmp/run", "run-secret-abc")
    assert "rs-" + "1" * 40 not in repr(env) and "stale" not in repr(env)
    assert env["env_vars"]["MINE"] == "1"
    assert env["env_vars"][run_secret.RAY_REF_ENV_VAR] == "run-secret-abc"
    assert env["worker_process_setup_hook"] == "telescope.core.cluster.run_secret.ray_worker_setup"
    assert env["env_vars"][run_secret.RAY_USER_HOOK_ENV_VAR] == hook
    assert cfg.ray_runtime_env["worker_process_setup_hook"] == hook  # the config is left as it was


def test_the_worker_hook_puts_the_published_secret_in_the_environment_then_runs_the_users(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``ray_worker_setup`` in a worker: the value under the ref wins over one the node had; the user's
    hook runs after it and sees it."""
    import ray.experimental.internal_kv as kv

    store = {(b"run-secret-abc", b"telescope"): b"the-published-one"}
    monkeypatch.setattr(
        kv, "_internal_kv_get", lambda key, namespace: store.get((key.encode(), namespace.encode()))
    )
    monkeypatch.setenv(run_secret.ENV_VAR, "the-nodes-own")
    monkeypatch.setenv(run_secret.RAY_REF_ENV_VAR, "run-secret-abc")
    monkeypatch.setenv(run_secret.RAY_USER_HOOK_ENV_VAR, f"{__name__}._user_hook")
    seen.clear()
    run_secret.ray_worker_setup()
    assert seen == ["the-published-one"]


seen: list[str] = []


def _user_hook() -> None:
    import os

    seen.append(os.environ[run_secret.ENV_VAR])


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


# Real clusters (security finding: Ray logs the job's ``runtime_env`` in clear to
# ``runtime_env_agent.log``, under the world-readable ``/tmp/ray``). A cluster of each kind: the private
# one a run starts, and one started elsewhere that the run joins (its workers inherit nothing from the
# driver). Afterwards every file under the Ray folder the cluster used and under the run directory is
# searched for the secret. The user's planted token, which still travels in ``runtime_env``, is found
# in ``runtime_env_agent.log`` there: the search reads the files Ray wrote the job's ``runtime_env`` to.

SECRET = "rs-planted-" + "3" * 40
TOKEN = "hf-planted-4c17"
TOKEN_RAY_TMP = "tok-" + "9" * 32

DRIVER = textwrap.dedent("""
    import json, os, sys
    import ray
    from ray.experimental.internal_kv import _internal_kv_get
    from telescope.core.cluster import run_secret
    from telescope.core.config import load_config
    from telescope.core.runtime.cluster import connect, shutdown

    address, run_dir = sys.argv[1], sys.argv[2]
    cfg = load_config(None, {"environments": [{"name": "reverse_text"}], "ray_address": address,
                             "ray_log_to_driver": False, "ray_auto_start_local": False,
                             "ray_runtime_env": {"env_vars": {"HF_TOKEN": sys.argv[3]}}})
    info = connect(cfg, run_dir)

    @ray.remote(num_cpus=0)
    class Server:
        def secret(self):
            import subprocess
            child = [sys.executable, "-c", "import os; print(os.environ['TELESCOPE_RUN_SECRET'])"]
            return os.environ.get("TELESCOPE_RUN_SECRET"), subprocess.check_output(child, text=True).strip()

    seen = ray.get(Server.remote().secret.remote())
    session = ray._private.worker._global_node.get_session_dir_path()
    ref = ray.get_runtime_context().runtime_env["env_vars"].get(run_secret.RAY_REF_ENV_VAR)
    shutdown(cfg, None, started_here=info["started_here"])
    left = None
    if ref and not info["started_here"]:  # the joined cluster lives on: the secret must be gone from it
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
        left = _internal_kv_get(ref, namespace=run_secret.RAY_KV_NAMESPACE)
        ray.shutdown()
    print(json.dumps({"seen": seen, "session": session, "started_here": info["started_here"],
                      "left": None if left is None else left.decode()}))
""")

HEAD = textwrap.dedent("""
    import sys
    import ray
    ray.init(address="local", include_dashboard=False, _temp_dir=sys.argv[1])
    print(ray.get_runtime_context().gcs_address, flush=True)
    sys.stdin.read()  # until the test is done with the cluster
    ray.shutdown()
""")


def _env(**extra: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "TELESCOPE_RUN_SECRET"))}
    return {**keep, **extra}


def _drive(address: str, run_dir: Path, env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, address, str(run_dir), TOKEN],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _files_holding(text: str, *roots: Path) -> list[str]:
    return sorted(
        str(p) for root in roots for p in root.rglob("*") if p.is_file() and text.encode() in p.read_bytes()
    )


@pytest.mark.slow
def test_a_private_cluster_keeps_the_secret_out_of_every_file_and_its_logs_private(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    seen = _drive("local", run_dir, _env(TELESCOPE_RUN_SECRET=SECRET))
    assert seen["started_here"] is True
    assert seen["seen"] == [SECRET, SECRET]  # the actor and a process it starts (a server) have it
    session = Path(str(seen["session"]))
    assert _files_holding(SECRET, session, run_dir) == []
    private = Path(tempfile.gettempdir()) / f"telescope-{os.getuid()}"
    assert session.parent.parent == private  # not /tmp/ray
    owner = os.stat(private)
    assert stat.S_IMODE(owner.st_mode) == 0o700 and owner.st_uid == os.getuid()
    # the user's own env_vars are still in Ray's log, where only this user can read them
    assert str(session / "logs" / "runtime_env_agent.log") in _files_holding(TOKEN, session)


@pytest.mark.slow
def test_a_joined_cluster_gets_the_secret_only_from_the_driver_and_logs_none_of_it(tmp_path: Path) -> None:
    """The cluster's processes never had the secret in their environment: the job's workers get it
    through the key-value store (``cluster.run_secret``), and the run removes it when it ends."""
    ray_tmp = Path(tempfile.mkdtemp(prefix="tsr-"))  # short: Ray's socket paths must stay < 108 bytes
    try:
        seen = _join_a_cluster_started_elsewhere(ray_tmp, tmp_path / "run")
        assert seen["started_here"] is False
        assert seen["seen"] == [SECRET, SECRET]
        assert seen["left"] is None
        assert Path(str(seen["session"])).parent == ray_tmp
        assert _files_holding(SECRET, ray_tmp, tmp_path) == []
        assert any(p.endswith("runtime_env_agent.log") for p in _files_holding(TOKEN, ray_tmp))
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _join_a_cluster_started_elsewhere(ray_tmp: Path, run_dir: Path) -> dict[str, object]:
    """A head started by another process, without the secret, joined by a run's driver."""
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN_RAY_TMP}
    head = subprocess.Popen(
        [sys.executable, "-c", HEAD, str(ray_tmp)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_env(**auth),
    )
    assert head.stdin is not None and head.stdout is not None
    try:
        address = head.stdout.readline().strip()
        assert address, "the head cluster did not start"
        return _drive(address, run_dir, _env(TELESCOPE_RUN_SECRET=SECRET, **auth))
    finally:
        head.stdin.close()
        head.wait(60)
