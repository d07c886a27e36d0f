"""Built-in demo models (made locally, no hub download). See ``telescope.core.models.tiny``.

Importing this package is light; ``tiny`` imports torch/transformers only when a model is built.
"""

from __future__ import annotations

__all__ = ["TINY_MODEL_SPECS", "build_tiny_model", "resolve_model_path"]


def __getattr__(name: str) -> object:
    # Lazy re-export so `import telescope.core.models` never pulls torch in.
    if name in __all__:
        from telescope.core.models import tiny

        return getattr(tiny, name)
    raise AttributeError(name)
