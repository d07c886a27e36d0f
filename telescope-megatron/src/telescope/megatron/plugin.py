"""Telescope plugin of telescope-megatron: registers the ``megatron`` trainer backend.

Importing this module is cheap (no torch, no megatron): availability is decided from the
Python version and the installed distributions; the backend module loads only when a run
selects ``train_backend: megatron``.
"""

from __future__ import annotations

from typing import Any

from telescope.core import hookimpl
from telescope.megatron.availability import unavailable_reason
from telescope.megatron.options import MegatronBackendKwargs


@hookimpl
def telescope_register_trainer_backends(register: Any) -> None:
    register.add(
        "megatron",
        "telescope.megatron.backend:create_megatron_backend",
        checkpoint_converter="telescope.megatron.convert:write_hf_weights",
        kwargs_model=MegatronBackendKwargs,
        description="Megatron-Core (TP/PP/EP, distributed optimizer, CPU offload, FP8); CUDA only",
        unavailable=unavailable_reason(),
    )
