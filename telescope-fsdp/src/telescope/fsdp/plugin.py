"""Telescope plugin of telescope-fsdp: registers the ``fsdp`` trainer backend.

Importing this module is cheap (no torch): the backend module loads only when a run selects
``train_backend: fsdp``.
"""

from __future__ import annotations

from typing import Any

from telescope.core import hookimpl
from telescope.fsdp.options import FSDPBackendKwargs


@hookimpl
def telescope_register_trainer_backends(register: Any) -> None:
    register.add(
        "fsdp",
        "telescope.fsdp.backend:create_fsdp_backend",
        checkpoint_converter="telescope.fsdp.convert:write_hf_weights",
        kwargs_model=FSDPBackendKwargs,
        supports_lora=True,
        description="PyTorch FSDP2 (fully_shard) on CUDA/NCCL or CPU/gloo, with sequence packing",
    )
