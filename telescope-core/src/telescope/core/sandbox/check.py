"""Config-time checks of a sandbox provider named inside an environment's kwargs."""

from __future__ import annotations

from typing import Any

__all__ = ["sandbox_provider_problems"]


def sandbox_provider_problems(
    registry: Any, name: str, kwargs: dict[str, Any], *, field: str = "kwargs.provider"
) -> list[str]:
    """Why ``name`` with ``kwargs`` cannot be used as a sandbox provider here (empty when it can).

    Unknown names get the registered ones (and a did-you-mean); a provider whose SDK is missing
    gets the pip command; bad provider kwargs get one line per field (``{field}_kwargs.x``).
    """
    from telescope.core.config.validate import component_problems

    return component_problems(registry, "sandbox_provider", name, field, kwargs)
