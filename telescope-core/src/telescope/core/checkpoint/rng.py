"""Per-rank RNG states (python ``random``, numpy, torch CPU and CUDA) saved with a checkpoint.

Shared by the FSDP and Megatron backends: ``save_rng_states(dir, rank, extra=...)`` writes
``rng_rank_<rank>.pt``; ``load_rng_states(dir, rank)`` restores it and returns the
backend's ``extra`` entries (e.g. Megatron's model-parallel CUDA RNG tracker), or None when
the file is missing (loaded with more ranks than saved: the RNG is left as it is, with a
warning). torch is imported inside the functions.

The file is data, never code: numpy's state is saved as a tensor and every file is read with
``torch.load(weights_only=True)`` (files of older releases, which pickled numpy arrays, load
with exactly numpy's array-rebuilding globals allowed), so a crafted checkpoint cannot run code.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

from telescope.core.checkpoint.layout import rng_file

__all__ = ["capture_rng_states", "load_rng_states", "restore_rng_states", "save_rng_states"]

logger = logging.getLogger(__name__)


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:  # numpy is optional for torch: no numpy, no numpy state to keep
        return None
    return numpy


def capture_rng_states() -> dict[str, Any]:
    """The current states of every generator this process uses."""
    import torch

    states: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    np = _numpy()
    if np is not None:
        kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
        states["numpy"] = {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype("int64")),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict[str, Any]) -> None:
    """Set every generator from ``capture_rng_states()`` output (missing entries are skipped)."""
    import torch

    if "python" in states:
        random.setstate(states["python"])
    np = _numpy()
    if "numpy" in states and np is not None:
        np.random.set_state(_numpy_state(np, states["numpy"]))
    if "torch" in states:
        torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        cuda = states["cuda"]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:
            logger.warning(
                "checkpoint has CUDA RNG states for %d devices, this process sees %d: CUDA RNG not restored",
                len(cuda),
                torch.cuda.device_count(),
            )


def save_rng_states(directory: str | Path, rank: int, extra: dict[str, Any] | None = None) -> Path:
    """Write this rank's states (plus ``extra``) to ``rng_rank_<rank>.pt``."""
    import torch

    path = rng_file(directory, rank)
    torch.save({**capture_rng_states(), "extra": dict(extra or {})}, path)
    return path


def load_rng_states(directory: str | Path, rank: int) -> dict[str, Any] | None:
    """Restore this rank's states; returns the saved ``extra`` dict, or None when absent."""
    import torch

    path = rng_file(directory, rank)
    if not path.is_file():
        logger.warning(
            "%s is missing (saved with fewer ranks?): rank %d keeps its current RNG state", path, rank
        )
        return None
    with torch.serialization.safe_globals(_legacy_numpy_globals()):
        states = torch.load(path, weights_only=True)
    restore_rng_states(states)
    extra: dict[str, Any] = states.get("extra", {})
    return extra


def _numpy_state(np: Any, saved: Any) -> Any:
    """numpy's ``get_state()`` tuple from what ``capture_rng_states`` saved (or an older release's tuple)."""
    if not isinstance(saved, dict):
        return saved
    keys = saved["keys"].numpy().astype(np.uint32)
    return (saved["kind"], keys, saved["pos"], saved["has_gauss"], saved["cached_gaussian"])


def _legacy_numpy_globals() -> list[Any]:
    """What an RNG file of an older release needs to rebuild its numpy arrays, and nothing else."""
    np = _numpy()
    if np is None:
        return []
    multiarray = getattr(getattr(np, "_core", None), "multiarray", None) or np.core.multiarray
    return [multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
