"""Local <-> global Megatron parameter names under pipeline and expert parallelism.

A pipeline stage numbers its layers from 0 (``decoder.layers.<local>``), and an expert-parallel
rank numbers its experts from 0; the mapping tables use global numbers.
"""

from __future__ import annotations

import re

from telescope.megatron.mapping.tp import expert_index, rename_expert

__all__ = ["global_name", "local_name"]

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")


def global_name(local: str, layer_offset: int = 0, expert_offset: int = 0) -> str:
    """Global name of a stage-local / EP-local parameter name."""
    name = _LAYER.sub(lambda m: f"decoder.layers.{int(m.group(1)) + layer_offset}.", local, count=1)
    e = expert_index(name)
    return rename_expert(name, e + expert_offset) if e is not None and expert_offset else name


def local_name(global_: str, layer_offset: int = 0, expert_offset: int = 0) -> str:
    """Inverse of ``global_name`` (raises when the layer/expert does not belong to this rank)."""

    def shift(m: re.Match[str]) -> str:
        layer = int(m.group(1)) - layer_offset
        if layer < 0:
            raise ValueError(f"{global_!r} is on an earlier pipeline stage (layer offset {layer_offset})")
        return f"decoder.layers.{layer}."

    name = _LAYER.sub(shift, global_, count=1)
    e = expert_index(name)
    if e is not None and expert_offset:
        if e < expert_offset:
            raise ValueError(f"{global_!r} belongs to another expert-parallel rank (offset {expert_offset})")
        name = rename_expert(name, e - expert_offset)
    return name
