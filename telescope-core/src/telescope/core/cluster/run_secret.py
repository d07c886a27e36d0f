"""The run's secret: one random token per run that every state-changing request must carry.

The driver makes it once (``ensure_run_secret``) and keeps it only in its environment, which the
processes it starts inherit (inference servers, ``telescope serve``'s engine): it is never written to
the run directory, a log or a command line. Clients send it as ``Authorization: Bearer <secret>``;
servers compare it in constant time (``authorized``). A user who wants a fixed secret (several runs
sharing one server) sets ``TELESCOPE_RUN_SECRET``.

Ray's workers get it through the cluster's key-value store, never through the job's ``runtime_env``:
Ray writes a ``runtime_env`` in clear to its session logs (``runtime_env_agent.log``, under the
world-readable ``/tmp/ray`` by default) and shows it to anyone who lists the cluster's jobs. The
driver puts the secret in the store under a random name (``publish_to_ray``: in the GCS's memory,
readable only by a client of the cluster, which Ray's token guards); the ``runtime_env`` carries only
that name (``RAY_REF_ENV_VAR``) and a worker setup hook (``ray_worker_setup``): every worker of the
job, on any node, copies the secret into its environment before it runs anything, and the servers it
starts inherit it from there.
"""

from __future__ import annotations

import hmac
import os
import secrets
import time
import uuid

ENV_VAR = "TELESCOPE_RUN_SECRET"
"""The environment variable that holds the run's secret."""

SCHEME = "Bearer"

RAY_REF_ENV_VAR = "TELESCOPE_RUN_SECRET_REF"
"""The name under which the run's secret is in the Ray cluster's key-value store (not the secret)."""

RAY_USER_HOOK_ENV_VAR = "TELESCOPE_USER_SETUP_HOOK"
"""The ``worker_process_setup_hook`` of the user's ``ray_runtime_env``, run after ``ray_worker_setup``."""

RAY_KV_NAMESPACE = "telescope"
RAY_WAIT_S = 60.0  # a worker Ray starts for the job at once may look before the driver has published
_published: list[str] = []


class MissingRunSecretError(RuntimeError):
    """A server was started to require the run's secret but none is in its environment."""


def ensure_run_secret() -> str:
    """The run's secret, made (32 random bytes, hex) and put in this process's environment if absent."""
    value = os.environ.get(ENV_VAR, "")
    if not value:
        value = secrets.token_hex(32)
        os.environ[ENV_VAR] = value
    return value


def current_run_secret() -> str:
    """The run's secret from the environment; raises when a server would otherwise run open."""
    value = os.environ.get(ENV_VAR, "")
    if not value:
        raise MissingRunSecretError(
            f"{ENV_VAR} is not set: this server takes state-changing requests only with the run's "
            f"secret; start it through `telescope train`/`telescope serve`, or export {ENV_VAR}=<token>"
        )
    return value


def auth_headers(secret: str | None = None) -> dict[str, str]:
    """The header that carries the run's secret (the environment's when ``secret`` is None)."""
    token = secret if secret is not None else os.environ.get(ENV_VAR, "")
    return {"Authorization": f"{SCHEME} {token}"} if token else {}


def authorized(authorization: str | None, secret: str) -> bool:
    """Whether an ``Authorization`` header value carries ``secret`` (constant-time comparison)."""
    if not authorization or not secret:
        return False
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != SCHEME.lower():
        return False
    return hmac.compare_digest(token.strip().encode(), secret.encode())


def new_ray_ref() -> str:
    """A fresh name for this run's secret in the Ray cluster's key-value store."""
    return f"run-secret-{uuid.uuid4().hex}"


def publish_to_ray(ref: str, secret: str) -> None:
    """Put ``secret`` under ``ref`` in the connected Ray cluster's key-value store (the driver, once
    connected)."""
    from ray.experimental.internal_kv import _internal_kv_put

    _internal_kv_put(ref, secret, overwrite=True, namespace=RAY_KV_NAMESPACE)
    _published.append(ref)


def withdraw_from_ray() -> None:
    """Remove what ``publish_to_ray`` put in a cluster that outlives the run (before disconnecting)."""
    from ray.experimental.internal_kv import _internal_kv_del

    while _published:
        ref = _published.pop()
        try:
            _internal_kv_del(ref, namespace=RAY_KV_NAMESPACE)
        except Exception:  # noqa: BLE001 - best effort at shutdown: a cluster in trouble keeps it
            pass


def ray_worker_setup() -> None:
    """Ray's ``worker_process_setup_hook`` for the run's workers: the secret from the key-value store
    into this process's environment, then the user's own hook if the run config named one."""
    ref = os.environ.get(RAY_REF_ENV_VAR)
    if ref:
        from ray.experimental.internal_kv import _internal_kv_get

        deadline = time.monotonic() + RAY_WAIT_S
        while (value := _internal_kv_get(ref, namespace=RAY_KV_NAMESPACE)) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{RAY_REF_ENV_VAR}={ref}: the run's secret is not in the Ray cluster's key-value store "
                    f"(namespace {RAY_KV_NAMESPACE!r}) after {RAY_WAIT_S:.0f} s; the driver publishes it when "
                    "it connects (telescope.core.runtime.cluster.connect): start the job's workers through it"
                )
            time.sleep(0.05)
        os.environ[ENV_VAR] = value.decode()
    user_hook = os.environ.get(RAY_USER_HOOK_ENV_VAR)
    if user_hook:
        from ray._common.utils import load_class

        load_class(user_hook)()


RAY_SETUP_HOOK = f"{__name__}.{ray_worker_setup.__name__}"
"""What the run's ``runtime_env`` gives Ray as ``worker_process_setup_hook``."""
