"""The gateway's errors, answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

A call the engine behind the gateway failed for the infrastructure (a 5xx, a connection that
broke) is answered 502 with ``code`` ``infra:<cause>:<provider>`` (``infra_code``), counted once,
where it happened; the agent's side reads it back (``telescope.core.infra.gateway_call_failure``).
"""

from __future__ import annotations

from typing import Any

from telescope.core import infra

__all__ = ["KINDS", "BadRequest", "GatewayError", "error_body", "infra_code"]

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
    return f"{infra.GATEWAY_CODE_PREFIX}{error.cause}:{error.provider}"
