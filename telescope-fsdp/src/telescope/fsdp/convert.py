"""FSDP checkpoint -> HF weight files (registered as the ``fsdp`` backend's ``checkpoint_converter``).

Only the ``model.*`` tensors of the DCP files are read, one output shard at a time (memory
stays near one shard), without a process group (``no_dist``). Names are already HF names;
dtypes are kept. When the config ties the input and output embeddings ``lm_head.weight`` is
dropped (safetensors refuses shared storage and ``from_pretrained`` re-ties it). The generic
steps (shard files and index, atomic output, hf_meta, config dtype) are
``telescope.core.checkpoint.convert``'s.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from telescope.core.checkpoint.convert import ConversionError, write_safetensors_shards
from telescope.core.checkpoint.layout import HF_META_DIR, read_trainer_meta

__all__ = ["model_tensor_specs", "write_hf_weights", "write_lora"]


def _ties_embeddings(hf_meta: Path) -> bool:
    """Whether the model config ties input and output embeddings (transformers' own default)."""
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(str(hf_meta))
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        return bool(getattr(text, "tie_word_embeddings", False))
    except (OSError, ValueError, KeyError):
        raw = json.loads((hf_meta / "config.json").read_text()) if (hf_meta / "config.json").is_file() else {}
        return bool(raw.get("tie_word_embeddings", False))


def model_tensor_specs(src: Path) -> list[tuple[str, str, Any]]:
    """``(hf_name, dcp_key, TensorStorageMetadata)`` for each model tensor in the DCP files."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = FileSystemReader(str(src)).read_metadata()
    specs = []
    for key, md in metadata.state_dict_metadata.items():
        if key.startswith("model.") and isinstance(md, TensorStorageMetadata):
            specs.append((key[len("model.") :], key, md))
    if not specs:
        raise ConversionError(
            f"{src} holds no model tensors in its DCP files; is it a complete FSDP checkpoint?"
        )
    return specs


def write_hf_weights(src: Path, out: Path, limit: int, *, merge: bool = False) -> None:
    """Write ``src``'s model tensors as safetensors shards of at most ``limit`` bytes into ``out``.

    A LoRA checkpoint (adapters only) is written as a PEFT adapter folder, or with ``merge`` as
    the base model with the adapters merged into its weights (``write_lora``).
    """
    lora = read_trainer_meta(src).get("lora")
    if lora:
        write_lora(src, out, limit, lora, merge=merge)
        return
    specs = model_tensor_specs(src)
    if _ties_embeddings(src / HF_META_DIR) and any(name != "lm_head.weight" for name, _, _ in specs):
        specs = [s for s in specs if s[0] != "lm_head.weight"]
    by_name = {name: (key, md) for name, key, md in specs}
    nbytes = [(name, md.size.numel() * _itemsize(md.properties.dtype)) for name, (_, md) in by_name.items()]
    write_safetensors_shards(out, nbytes, limit, lambda names: _read_tensors(src, by_name, names))


def _read_tensors(src: Path, by_name: dict[str, tuple[str, Any]], names: list[str]) -> dict[str, Any]:
    """``{hf name: tensor}`` of ``names``, read from the DCP files without a process group."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    flat = {
        by_name[n][0]: torch.empty(tuple(by_name[n][1].size), dtype=by_name[n][1].properties.dtype)
        for n in names
    }
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message=".*single process", category=UserWarning)
        dcp.load(flat, storage_reader=FileSystemReader(str(src)), no_dist=True)
    return {n: flat[by_name[n][0]] for n in names}


def _itemsize(dtype: Any) -> int:
    import torch

    return int(torch.empty((), dtype=dtype).element_size())


def write_lora(src: Path, out: Path, limit: int, lora: dict[str, Any], *, merge: bool = False) -> None:
    """The adapters of LoRA checkpoint ``src`` as a PEFT folder (``adapter_config.json``,
    ``adapter_model.safetensors`` with PEFT's names: ``PeftModel.from_pretrained(base, out)``
    loads it), or with ``merge`` the base model (``trainer_meta.json``'s ``base_model``) with
    ``W + (alpha / r) B A`` merged in, saved by ``save_pretrained`` in the checkpoint's dtype."""
    import tempfile

    import torch
    import torch.distributed.checkpoint as dcp
    from peft import LoraConfig
    from safetensors.torch import save_file
    from torch.distributed.checkpoint import FileSystemReader

    from telescope.core.weights.lora import is_adapter_name, wire_name

    meta = read_trainer_meta(src)
    specs = [s for s in model_tensor_specs(src) if is_adapter_name(s[0])]
    if not specs:
        raise ConversionError(f"{src} is marked as a LoRA checkpoint but holds no adapter tensors")
    flat = {key: torch.empty(tuple(md.size), dtype=md.properties.dtype) for _, key, md in specs}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*single process", category=UserWarning)
        dcp.load(flat, storage_reader=FileSystemReader(str(src)), no_dist=True)
    adapters = {wire_name(name): flat[key] for name, key, _ in specs}
    base = str(meta.get("base_model", ""))
    # the modules that carry adapters, by name (vLLM's LoRA loader does not resolve "all-linear")
    modules = sorted({name.split(".lora_", 1)[0].rsplit(".", 1)[-1] for name, _, _ in specs})
    config = LoraConfig(**{**lora, "target_modules": modules, "base_model_name_or_path": base})
    target = Path(tempfile.mkdtemp(dir=out.parent)) if merge else out
    try:
        config.save_pretrained(str(target))
        save_file(adapters, str(target / "adapter_model.safetensors"), metadata={"format": "pt"})
        if merge:
            _write_merged(base, target, out, limit, str(meta.get("model_dtype", "float32")))
    finally:
        if merge:
            import shutil

            shutil.rmtree(target, ignore_errors=True)


def _write_merged(base: str, adapter_dir: Path, out: Path, limit: int, dtype: str) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from telescope.core.models.tiny import resolve_model_path

    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(base), dtype=getattr(torch, dtype))
    merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(str(out), max_shard_size=limit)
