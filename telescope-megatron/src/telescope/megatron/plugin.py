"""Registers the ``megatron`` trainer backend (listed as unavailable until it is implemented)."""

from __future__ import annotations

from telescope.core import hookimpl


@hookimpl
def telescope_register_trainer_backends(register):  # type: ignore[no-untyped-def]
    register.add(
        "megatron",
        "telescope.megatron.backend:MegatronBackend",
        description="Megatron-Core backend (TP/PP/CP/EP)",
        unavailable="not implemented yet in this release; use train_backend: fsdp",
    )
