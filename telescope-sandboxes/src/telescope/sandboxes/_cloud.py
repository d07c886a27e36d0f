"""What the cloud providers share: explicit-setting checks, output capping, error mapping."""

from __future__ import annotations

import math
from collections.abc import Iterable

from telescope.core.sandbox import ExecResult, SandboxConfig, SandboxConfigError, SandboxError
from telescope.core.sandbox.errors import classify_provider_error

__all__ = ["capped_result", "explicit", "map_sdk_error", "reject_explicit", "whole"]


def explicit(config: SandboxConfig, field: str) -> bool:
    """True when the user set ``field`` (an unset field means "the provider's default")."""
    return field in config.model_fields_set


def reject_explicit(config: SandboxConfig, provider: str, fields: Iterable[str], why: str) -> None:
    """Refuse every explicitly set field in ``fields`` that the provider cannot honour."""
    bad = [f for f in fields if explicit(config, f)]
    if bad:
        shown = ", ".join(f"{f}={getattr(config, f)!r}" for f in bad)
        raise SandboxConfigError(f"{provider} sandbox cannot honour {shown}: {why}. Remove the setting(s).")


def whole(value: float, *, provider: str, field: str, unit: str, per: float = 1.0) -> int:
    """``value / per`` as an integer, or a `SandboxConfigError` when it is not whole."""
    scaled = value / per
    if not math.isclose(scaled, round(scaled)) or round(scaled) < 1:
        raise SandboxConfigError(
            f"{provider} sandbox takes whole {unit}: {field}={value:g} is {scaled:g} {unit}; "
            f"use a multiple of {per:g}"
        )
    return round(scaled)


def capped_result(
    exit_code: int | None, stdout: str | None, stderr: str | None, cap: int, *, timed_out: bool = False
) -> ExecResult:
    """An `ExecResult` with stdout/stderr cut at ``cap`` bytes (UTF-8), like the local provider."""
    out, out_cut = _cap(stdout or "", cap)
    err, err_cut = _cap(stderr or "", cap)
    return ExecResult(exit_code, out, err, out_cut, err_cut, timed_out=timed_out)


def _cap(text: str, cap: int) -> tuple[str, bool]:
    data = text.encode("utf-8", errors="replace")
    if len(data) <= cap:
        return text, False
    return data[:cap].decode("utf-8", errors="ignore"), True


def map_sdk_error(
    exc: BaseException,
    mapping: dict[type[BaseException], type[SandboxError]],
    *,
    provider: str,
    sandbox_id: str | None,
    action: str,
) -> SandboxError:
    """Map an SDK exception by class (first match in ``mapping``), else by message."""
    for sdk_cls, ours in mapping.items():
        if isinstance(exc, sdk_cls):
            return ours(f"{provider} while {action}: {type(exc).__name__}: {exc}", sandbox_id=sandbox_id)
    return classify_provider_error(exc, provider=provider, sandbox_id=sandbox_id, action=action)
