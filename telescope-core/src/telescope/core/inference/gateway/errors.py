"""The gateway's errors, answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

A call the engine behind the gateway failed for the infrastructure (a 5xx, a connection that
broke) is answered 502 with ``code`` ``infra:<cause>:<provider>`` (``infra_code``), counted once,
where it happened. On the agent's side ``transport_failure`` makes an exception of the agent's
OpenAI client an infrastructure failure (``telescope.core.infra``: retried, then masked, never a
reward of 0) when its call to the gateway failed for a transport reason: that 502, another 5xx,
a connection refused or reset, a timeout (cause ``gateway_transport``, counted there).
"""

from __future__ import annotations

import sys
from typing import Any

from telescope.core import infra

__all__ = ["KINDS", "BadRequest", "GatewayError", "error_body", "infra_code", "transport_failure"]

INFRA_CODE_PREFIX = "infra:"

#: OpenAI's error type of each status the gateway answers.
KINDS = {
    400: "invalid_request_error",
    401: "authentication_error",  # no key, a wrong key, an unknown rollout key
    403: "permission_error",  # a known rollout key that may not call now (ended, or at its limits)
    404: "not_found_error",  # no such route or model
    415: "invalid_request_error",  # a POST that is not JSON
    421: "invalid_request_error",  # a Host that does not name the gateway (DNS rebinding)
    502: "server_error",  # the engine behind the gateway failed or could not be reached
}


class GatewayError(Exception):
    """A request the gateway refuses, with its HTTP status; the message says what to change."""

    def __init__(
        self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """The OpenAI error body."""
        return error_body(str(self), KINDS.get(self.status, "server_error"), self.param, self.code)


class BadRequest(GatewayError):
    """HTTP 400: the request is malformed or asks for something the gateway cannot do."""


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """``{"error": {...}}`` as OpenAI answers errors."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def infra_code(exc: BaseException) -> str:
    """The 502 ``code`` of an engine call that failed with ``exc``: the infrastructure failure it was
    marked as where it happened, else (marked and counted here) a ``gateway_transport`` of the engine."""
    error = infra.infra_cause(exc) or infra.mark(exc, cause="gateway_transport", provider="inference")
    return f"{INFRA_CODE_PREFIX}{error.cause}:{error.provider}"


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling."""
    out: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not e for e in out):
        out.append(current)
        current = current.__cause__ or current.__context__
    return out


def transport_failure(exc: BaseException, gateway_url: str) -> infra.InfraError | None:
    """The infrastructure failure ``exc`` is when it comes from (or was raised from) an OpenAI
    client's call to the gateway at ``gateway_url`` that failed for a transport reason, marked on
    ``exc``; None for anything else (a refused or malformed call, the agent's own code or services)."""
    openai = sys.modules.get("openai")
    if openai is None:  # no OpenAI client was ever used in this process
        return None
    base = gateway_url.rstrip("/")
    for error in _chain(exc):
        request = getattr(error, "request", None)
        if not isinstance(error, openai.APIError) or not str(getattr(request, "url", "")).startswith(base):
            continue
        if isinstance(error, openai.APIConnectionError):  # refused, reset, timed out (APITimeoutError)
            return infra.mark(exc, cause="gateway_transport", provider="gateway")
        if isinstance(error, openai.APIStatusError) and error.status_code >= 500:
            code = str(error.code or "")
            cause, _, provider = code.removeprefix(INFRA_CODE_PREFIX).partition(":")
            if code.startswith(INFRA_CODE_PREFIX) and cause in infra.CAUSES:  # counted by the gateway
                return infra.mark(exc, cause=cause, provider=provider or "gateway", count=False)  # type: ignore[arg-type]
            return infra.mark(exc, cause="gateway_transport", provider="gateway")
    return None
