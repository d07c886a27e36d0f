"""What every HTTP listener of a run checks before it reads a request: Host, the run's secret, JSON.

- **Host** (DNS rebinding): a web page of ``evil.example`` whose name is made to resolve to
  127.0.0.1 reaches a loopback server with ``Host: evil.example``. Accepted are ``localhost``,
  address literals (a page loaded from an address cannot be rebound: its origin *is* the address),
  the address the server is bound to and the names in ``TELESCOPE_ALLOWED_HOSTS`` (comma separated,
  for a server reached through a DNS name). Otherwise 421.
- **Secret**: every route except the ``open_paths`` (``/health``: liveness probes) needs
  ``Authorization: Bearer <run secret>`` (``cluster.run_secret``). Otherwise 401.
- **JSON**: a POST/PUT/PATCH must say ``Content-Type: application/json``: a web page can send a
  ``no-cors`` request only as ``text/plain``, a form or nothing, never JSON. Otherwise 415.

Framework free (the transformers engine's aiohttp app, the ASGI middleware in vLLM's server and the
OTLP receiver's ``http.server`` call ``refusal``; the agent gateway, whose callers carry the secret
or a rollout key of their own, calls ``host_refusal`` and ``content_type_refusal``); imports
nothing heavy.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from telescope.core.cluster.run_secret import ENV_VAR, authorized

__all__ = [
    "ALLOWED_HOSTS_ENV",
    "Refusal",
    "content_type_refusal",
    "host_allowed",
    "host_name",
    "host_refusal",
    "refusal",
]

#: Extra host names a server answers to (comma separated), e.g. a DNS name that reaches a node.
ALLOWED_HOSTS_ENV = "TELESCOPE_ALLOWED_HOSTS"

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused before it is read: the status and a message naming the fix."""

    status: int
    message: str

    @property
    def headers(self) -> dict[str, str]:
        """Headers of the refusal (a 401 says which scheme it wants)."""
        return {"WWW-Authenticate": 'Bearer realm="telescope"'} if self.status == 401 else {}


def host_name(header: str) -> str:
    """The host of a ``Host`` header, lower case, without port or IPv6 brackets."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value[1:]
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        return False
    return True


def host_allowed(header: str | None, bound_host: str = "", extra: Iterable[str] = ()) -> bool:
    """Whether ``header`` (a request's Host) names this server (see the module doc)."""
    name = host_name(header or "")
    if not name:
        return False
    configured = {host_name(h) for h in os.environ.get(ALLOWED_HOSTS_ENV, "").split(",") if h.strip()}
    allowed = {"localhost", host_name(bound_host), *(host_name(h) for h in extra), *configured}
    return name in allowed or _is_address(name)


def host_refusal(host: str | None, *, bound_host: str = "", what: str = "this server") -> Refusal | None:
    """421 unless the request's ``Host`` names this server (see the module doc), else None."""
    if host_allowed(host, bound_host):
        return None
    return Refusal(
        421,
        f"Host {host!r} does not name {what}: send a Host of localhost, an address of this machine or "
        f"a name listed in {ALLOWED_HOSTS_ENV} (a foreign host name is how DNS rebinding looks)",
    )


def content_type_refusal(
    method: str,
    path: str,
    content_type: str | None,
    content_types: Iterable[str] = ("application/json",),
) -> Refusal | None:
    """415 for a POST/PUT/PATCH whose ``Content-Type`` is none of ``content_types`` (never one a web
    page can send ``no-cors``: ``text/plain``, forms), else None."""
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    accepted = tuple(content_types)
    if method.upper() not in BODY_METHODS or kind in accepted:
        return None
    return Refusal(
        415,
        f"{method} {path} with content type {kind or 'none'!r} refused: send "
        f"'Content-Type: {accepted[0]}' (also for an empty body: {{}})"
        + (f"; accepted: {', '.join(accepted)}" if len(accepted) > 1 else ""),
    )


def refusal(
    method: str,
    path: str,
    header: Callable[[str], str | None],
    *,
    secret: str,
    bound_host: str = "",
    open_paths: Iterable[str] = ("/health",),
    what: str = "this server",
    content_types: Iterable[str] = ("application/json",),
) -> Refusal | None:
    """The refusal of one request, or None when it may be served: Host, then the secret (except on
    ``open_paths``), then the content type.

    ``header(name)`` returns a request header (case-insensitive) or None; ``path`` is without query.
    """
    refused = host_refusal(header("Host"), bound_host=bound_host, what=what)
    if refused is not None or path in set(open_paths):
        return refused
    if not authorized(header("Authorization"), secret):
        return Refusal(
            401,
            f"{method} {path} needs the run's secret: send 'Authorization: Bearer <{ENV_VAR}>' (the "
            f"clients of the run that started {what} do; a process outside the run cannot)",
        )
    return content_type_refusal(method, path, header("Content-Type"), content_types)
