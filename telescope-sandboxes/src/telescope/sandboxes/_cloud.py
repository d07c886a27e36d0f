"""What the cloud providers share: the kwargs base models, the provider base class (SDK import,
credential, SDK errors mapped to ours), explicit-setting checks and output capping."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from telescope.core.sandbox import (
    ExecResult,
    SandboxConfig,
    SandboxConfigError,
    SandboxError,
    SandboxProvider,
    import_sdk,
    require_credential,
)
from telescope.core.sandbox.errors import classify_provider_error

__all__ = [
    "CloudKwargs",
    "CloudSandboxProvider",
    "KeyedCloudKwargs",
    "capped_result",
    "explicit",
    "map_sdk_error",
    "reject_explicit",
    "whole",
]


class CloudKwargs(BaseModel):
    """Base of a cloud provider's kwargs model: unknown keys are errors, fields documented below them."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class KeyedCloudKwargs(CloudKwargs):
    """Kwargs of a provider that authenticates with an API key."""

    api_key: str | None = None
    """API key; None: the provider's environment variable (named in its kwargs' description)."""


class CloudSandboxProvider(SandboxProvider):
    """Base of the cloud providers: imports the SDK, resolves the API key, maps SDK errors to ours.

    A subclass sets ``name`` and, when it authenticates with a key, ``credential_env`` (the
    environment variables read when ``kwargs.api_key`` is None); ``sdk_errors`` names the SDK's
    exception classes that mean one of our errors; ``mapped_errors`` wraps each SDK call.
    """

    #: Environment variables holding the API key, first found wins; () = no key (e.g. Modal's tokens).
    credential_env: ClassVar[tuple[str, ...]] = ()

    def __init__(self, kwargs: Any, *, sdk: str, pip_name: str, extra: str) -> None:
        self.kwargs = kwargs
        self.sdk = import_sdk(sdk, provider=self.name, pip_name=pip_name, extra=extra)
        self.api_key: str | None = None
        if self.credential_env:
            self.api_key = require_credential(kwargs.api_key, self.credential_env, provider=self.name)

    def sdk_errors(self) -> dict[type[BaseException], type[SandboxError]]:
        """SDK exception class -> our error (first match wins); others are classified by message."""
        return {}

    @contextlib.contextmanager
    def mapped_errors(self, sandbox_id: str | None, action: str) -> Iterator[None]:
        """Re-raise an exception of the SDK call inside as our ``SandboxError`` (chained)."""
        try:
            yield
        except Exception as exc:
            raise map_sdk_error(
                exc, self.sdk_errors(), provider=self.name, sandbox_id=sandbox_id, action=action
            ) from exc


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
