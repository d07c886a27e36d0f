"""The run's secret: one random token per run that every state-changing request must carry.

The driver makes it once (``ensure_run_secret``) and keeps it only in its environment, which the
processes it starts inherit (inference servers, Ray workers, ``telescope serve``'s engine): it is
never written to the run directory, a log or a command line. Clients send it as
``Authorization: Bearer <secret>``; servers compare it in constant time (``authorized``).
A user who wants a fixed secret (several runs sharing one server) sets ``TELESCOPE_RUN_SECRET``.
"""

from __future__ import annotations

import hmac
import os
import secrets

ENV_VAR = "TELESCOPE_RUN_SECRET"
"""The environment variable that holds the run's secret."""

SCHEME = "Bearer"


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
