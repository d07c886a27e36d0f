"""Megatron tensors from an HF checkpoint, read tensor by tensor (no whole-model copy on any rank).

Loading ``AutoModelForCausalLM`` in fp32 and converting its whole state dict on every rank held two
full fp32 copies of the model per process (about 500 GB of host memory for an 8B model on 8 GPUs).
``HFCheckpoint`` opens the checkpoint's safetensors files lazily, and ``MegatronFromHF`` converts only
the rules whose Megatron tensors a rank asks for, reading just their HF tensors (in the stored dtype),
so a rank holds at most one rule's tensors at a time (e.g. one layer's q/k/v) and never reads the
layers of other pipeline stages or the experts of other expert-parallel ranks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from telescope.megatron.mapping.rules import Rule, conversion_rules, detect_expert_layout
from telescope.megatron.mapping.spec import ModelSpec

__all__ = ["HFCheckpoint", "MegatronFromHF", "open_hf_checkpoint"]


class HFCheckpoint(Mapping[str, torch.Tensor]):
    """The tensors of a local HF checkpoint folder (``model.safetensors`` or a sharded index),
    each read from disk when asked for."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        index = self.folder / "model.safetensors.index.json"
        if index.is_file():
            self._files = {k: self.folder / v for k, v in json.loads(index.read_text())["weight_map"].items()}
        else:
            from safetensors import safe_open

            single = self.folder / "model.safetensors"
            with safe_open(str(single), framework="pt") as fh:
                self._files = {k: single for k in fh.keys()}
        self._open: dict[Path, Any] = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        path = self._files[name]
        if path not in self._open:
            self._open[path] = safe_open(str(path), framework="pt")
        return self._open[path].get_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)


def open_hf_checkpoint(model: str) -> HFCheckpoint | None:
    """The safetensors checkpoint of ``model`` (a folder, or a hub id already in the local cache), or
    None when there is none (the caller falls back to ``from_pretrained``)."""
    folder = Path(model)
    if not folder.is_dir():
        try:
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(model, allow_patterns=["*.safetensors", "*.json"]))
        except Exception:  # noqa: BLE001 - no hub access, not a hub id, ...: from_pretrained decides
            return None
    if (
        not (folder / "model.safetensors.index.json").is_file()
        and not (folder / "model.safetensors").is_file()
    ):
        return None
    return HFCheckpoint(folder)


class MegatronFromHF:
    """``get(megatron_name)``: the full (unsharded) Megatron tensor, converted from just the HF tensors
    its rule needs. The last rule's other outputs are kept for the next call (a layer's experts, a
    fused QKV's parameters come in a row); anything older is dropped."""

    def __init__(
        self, source: Mapping[str, torch.Tensor], spec: ModelSpec, *, te_spec: bool, padded_vocab: int
    ) -> None:
        self.source = source
        rules = conversion_rules(
            spec, te_spec=te_spec, padded_vocab=padded_vocab, expert_layout=detect_expert_layout(source)
        )
        self._rules: dict[str, Rule] = {name: rule for rule in rules for name in rule.megatron}
        self._last: tuple[Rule, dict[str, torch.Tensor]] | None = None

    def missing(self) -> list[str]:
        """HF tensors some rule needs that the source lacks (e.g. a checkpoint whose names
        transformers renames on load)."""
        return sorted({n for rule in set(self._rules.values()) for n in rule.hf if n not in self.source})

    def __contains__(self, name: object) -> bool:
        return name in self._rules

    def get(self, name: str) -> torch.Tensor:
        rule = self._rules.get(name)
        if rule is None:
            raise KeyError(f"Megatron tensor {name} has no HF source tensor")
        if self._last is None or self._last[0] is not rule:
            missing = [n for n in rule.hf if n not in self.source]
            if missing:
                raise KeyError(f"the HF checkpoint lacks {missing[:4]} (needed for {name})")
            converted = rule.to_megatron([self.source[n] for n in rule.hf])
            self._last = (rule, dict(zip(rule.megatron, converted, strict=True)))
        return self._last[1][name]
