"""Config-time checks of a sandbox provider named inside an environment's kwargs."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

__all__ = ["sandbox_provider_problems"]


def sandbox_provider_problems(
    registry: Any, name: str, kwargs: dict[str, Any], *, field: str = "kwargs.provider"
) -> list[str]:
    """Why ``name`` with ``kwargs`` cannot be used as a sandbox provider here (empty when it can).

    Unknown names get the registered ones (and a did-you-mean); a provider whose SDK is missing
    gets the pip command; bad provider kwargs get one line per field.
    """
    from telescope.core.registry import UnknownComponentError

    try:
        component = registry.get("sandbox_provider", name)
    except UnknownComponentError as exc:
        return [f"{field}: {exc}"]
    if not component.available:
        return [f"{field}: sandbox provider '{name}' is installed but unavailable: {component.unavailable}"]
    try:
        component.validate_kwargs(kwargs)
    except ValidationError as exc:
        from telescope.core.config.errors import problems_from_validation_error

        return problems_from_validation_error(exc, prefix=f"{field}_kwargs.")
    except TypeError as exc:
        return [f"{field}_kwargs: {exc}"]
    return []
