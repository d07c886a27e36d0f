"""Typed sandbox errors: every provider maps its failures onto these classes.

Callers (environments, the pool) branch on the class, never on message text: a
``SandboxConfigError`` is the user's to fix, ``SandboxNotRunningError`` means "discard this
sandbox and get another", ``SandboxCommandTimeoutError`` means the command itself ran too long
where a provider cannot report that as a result.
"""

from __future__ import annotations

from telescope.core.infra import InfraCause, infra_cause

__all__ = [
    "SandboxAuthError",
    "SandboxCommandTimeoutError",
    "SandboxConfigError",
    "SandboxDependencyError",
    "SandboxError",
    "SandboxImagePullError",
    "SandboxNotRunningError",
    "SandboxOOMError",
    "SandboxPathError",
    "SandboxPoolClosedError",
    "SandboxPoolTimeoutError",
    "SandboxUnavailableError",
    "USER_ERRORS",
    "classify_provider_error",
    "infra_cause_of",
]


class SandboxError(RuntimeError):
    """Base class of every sandbox failure; ``sandbox_id`` names the sandbox when known."""

    def __init__(self, message: str, *, sandbox_id: str | None = None) -> None:
        super().__init__(message)
        self.sandbox_id = sandbox_id


class SandboxConfigError(SandboxError, ValueError):
    """The provider cannot honour a requested setting (named in the message, with the fix)."""


class SandboxDependencyError(SandboxError, ImportError):
    """The provider's SDK is not installed (the message names the pip package)."""


class SandboxAuthError(SandboxError):
    """Credentials are missing or rejected (the message names the environment variable)."""


class SandboxUnavailableError(SandboxError):
    """The provider cannot run here, e.g. no bubblewrap and unsandboxed execution not allowed."""


class SandboxNotRunningError(SandboxError):
    """The sandbox is gone (destroyed, expired, terminated by the provider)."""


class SandboxOOMError(SandboxError):
    """The sandbox ran out of memory."""


class SandboxImagePullError(SandboxError):
    """The provider could not pull or build the requested image."""


class SandboxPathError(SandboxError, ValueError):
    """A path escapes the sandbox workspace or is otherwise not allowed."""


class SandboxPoolClosedError(SandboxError):
    """The pool was shut down."""


class SandboxPoolTimeoutError(SandboxError, TimeoutError):
    """No sandbox became available within the acquire timeout."""


class SandboxCommandTimeoutError(SandboxError, TimeoutError):
    """A provider call (or a command, where the provider cannot return a result) timed out."""

    def __init__(self, command: str, timeout: float, *, sandbox_id: str | None = None) -> None:
        shown = command if len(command) <= 200 else command[:200] + "..."
        super().__init__(f"command timed out after {timeout:g}s: {shown}", sandbox_id=sandbox_id)
        self.command = command
        self.timeout = timeout


USER_ERRORS: tuple[type[BaseException], ...] = (
    SandboxConfigError,
    SandboxDependencyError,
    SandboxAuthError,
    SandboxUnavailableError,
    SandboxPathError,
    ValueError,
)
"""Failures the user fixes (settings, credentials, installs, paths): raised as they are, never
retried as infrastructure."""


def infra_cause_of(exc: BaseException, action: str) -> InfraCause | None:
    """The infrastructure cause of a provider failure while ``action`` (``create`` or another call),
    or None when it is not the infrastructure's (a user error, a bug in the caller)."""
    marked = infra_cause(exc)
    if marked is not None:
        return marked.cause
    if isinstance(exc, USER_ERRORS) or not isinstance(exc, SandboxError | OSError | TimeoutError):
        return None
    if action == "create":
        return "sandbox_create"
    if isinstance(exc, SandboxOOMError):
        return "sandbox_oom"
    if isinstance(exc, SandboxNotRunningError):
        return "sandbox_lost"
    if isinstance(exc, TimeoutError):
        return "provider_timeout"
    return "provider_error"


_MESSAGE_CLASSES: tuple[tuple[tuple[str, ...], type[SandboxError]], ...] = (
    (("unauthorized", "401", "403", "api key", "forbidden", "authentication"), SandboxAuthError),
    (("out of memory", "oom", "memory limit"), SandboxOOMError),
    (("image", "pull", "template not found", "build failed"), SandboxImagePullError),
    (("not running", "not found", "terminated", "stopped", "does not exist", "404"), SandboxNotRunningError),
)


def classify_provider_error(
    exc: BaseException, *, provider: str, sandbox_id: str | None = None, action: str = ""
) -> SandboxError:
    """Map an SDK exception with no more specific mapping onto the hierarchy by its message.

    Providers first map the SDK's own exception classes; this is the fallback for the rest.
    The original exception stays attached as ``__cause__`` when the caller raises ``from exc``.
    """
    if isinstance(exc, SandboxError):
        return exc
    text = f"{type(exc).__name__}: {exc}"
    lowered = text.lower()
    where = f" while {action}" if action else ""
    for needles, cls in _MESSAGE_CLASSES:
        if any(n in lowered for n in needles):
            return cls(f"{provider}{where}: {text}", sandbox_id=sandbox_id)
    return SandboxError(f"{provider}{where}: {text}", sandbox_id=sandbox_id)
