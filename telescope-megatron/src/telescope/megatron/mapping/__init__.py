"""Hugging Face <-> Megatron-Core weight mapping for the architectures the backend supports.

Torch tensors in, torch tensors out; no megatron import, so all of it runs (and is tested) on CPU.
"""

from __future__ import annotations

from telescope.megatron.mapping.convert import (
    MegatronToHFStream,
    hf_to_megatron,
    megatron_to_hf,
)
from telescope.megatron.mapping.spec import SUPPORTED_MODEL_TYPES, ModelSpec, model_spec_from_hf_config
from telescope.megatron.mapping.tp import shard_state_dict, tp_partition, unshard_state_dicts

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "MegatronToHFStream",
    "ModelSpec",
    "hf_to_megatron",
    "megatron_to_hf",
    "model_spec_from_hf_config",
    "shard_state_dict",
    "tp_partition",
    "unshard_state_dicts",
]
