"""Checkpoints: atomic folders, retention, RNG states, HF metadata and conversion to HF format.

Torch-free at import. The API the run driver uses::

    from telescope.core.checkpoint import CheckpointManager, checkpoint_due, CheckpointNotFoundError
    mgr = CheckpointManager(root, keep_last=None, keep_every=None)
    partial = mgr.begin(step); ...; final = mgr.commit(partial, step, meta={...})  # or mgr.abort(partial)
    mgr.cleanup_partials(); mgr.steps(); mgr.latest(); mgr.path(step); mgr.read_meta(path)
    mgr.resolve(resume_from_checkpoint)   # True = latest, int = that step

Trainer backends use ``rng.save_rng_states`` / ``load_rng_states`` and
``hf_meta.write_hf_meta``; ``convert_checkpoint`` / ``convert_all`` (module ``convert``,
loaded on first use) write Hugging Face folders; ``is_native_checkpoint`` /
``is_hf_checkpoint`` tell the two apart. Folder layout: ``telescope.core.checkpoint.layout``.
"""

from __future__ import annotations

from typing import Any

from telescope.core.checkpoint.layout import is_hf_checkpoint, is_native_checkpoint
from telescope.core.checkpoint.manager import CheckpointManager, CheckpointNotFoundError, checkpoint_due

__all__ = [
    "CheckpointManager",
    "CheckpointNotFoundError",
    "ConversionError",
    "checkpoint_due",
    "convert_all",
    "convert_checkpoint",
    "is_hf_checkpoint",
    "is_native_checkpoint",
]

_LAZY = {"ConversionError", "convert_all", "convert_checkpoint"}


def __getattr__(name: str) -> Any:
    # convert.py is itself torch-free at import, but kept lazy so the manager stays minimal.
    if name in _LAZY:
        from telescope.core.checkpoint import convert

        return getattr(convert, name)
    raise AttributeError(name)
