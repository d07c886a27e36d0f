"""Native checkpoint -> Hugging Face folder (``telescope checkpoint convert``).

``convert_checkpoint(src, out, max_shard_size="5GB")`` writes ``model.safetensors`` (or
``model-0000i-of-0000n.safetensors`` shards plus ``model.safetensors.index.json`` when the
weights exceed ``max_shard_size``) and copies ``config.json``, ``generation_config.json`` and
the tokenizer files from the checkpoint's ``hf_meta/``, so ``from_pretrained(out)`` works.
``config.json`` names the dtype the weights are stored in (``dtype``, and ``torch_dtype``
where the base config has it): a base config saying bfloat16 for weights trained and saved
in float32 would otherwise make ``from_pretrained`` (which follows the config's dtype)
load a rounded model whose logits differ from the trainer's. A config that already names
the stored dtype is copied byte for byte.

- The weights are written by the trainer backend's own converter, registered with the backend
  (``checkpoint_converter``): ``telescope.fsdp.convert`` reads the DCP files,
  ``telescope.megatron.convert`` copies the HF weights saved beside the checkpoint.
- An HF folder given as input is an error that says so.
The output is written to a temporary folder beside ``out`` and renamed into place; an
existing ``out`` is only replaced with ``overwrite=True``. ``convert_all(root, out_root)``
converts every committed ``step_<N>`` under ``root`` to ``out_root/step_<N>``, skipping
outputs that already exist. torch is imported inside the functions.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from telescope.core.checkpoint.hf_meta import copy_hf_meta
from telescope.core.checkpoint.layout import (
    HF_META_DIR,
    checkpoint_backend,
    is_hf_checkpoint,
    is_native_checkpoint,
    read_trainer_meta,
)

__all__ = [
    "ConversionError",
    "ConvertResult",
    "backend_converter",
    "convert_all",
    "convert_checkpoint",
    "match_config_dtype",
    "parse_size",
    "shard_file_names",
    "stored_float_dtype",
    "write_safetensors_shards",
]

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


class ConversionError(ValueError):
    """A conversion the user asked for cannot be done as given (bad input or output path)."""


@dataclass(frozen=True)
class ConvertResult:
    """One checkpoint of a ``convert_all`` run."""

    src: Path
    """The native checkpoint folder."""
    out: Path
    """The HF folder (written now, or already there)."""
    skipped: bool
    """True when ``out`` already existed and was left alone."""


def parse_size(size: int | str) -> int:
    """Bytes in ``size``: an int, or a string like ``"5GB"``, ``"500MB"``, ``"2GiB"``."""
    if isinstance(size, int) and not isinstance(size, bool):
        value = size
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)\s*", str(size), flags=re.IGNORECASE)
        if not match:
            raise ConversionError(f"max_shard_size {size!r} is not a size; give bytes or e.g. '5GB', '500MB'")
        value = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    if value < 1:
        raise ConversionError(f"max_shard_size {size!r} must be at least 1 byte")
    return value


def convert_checkpoint(
    src: str | Path,
    out: str | Path,
    *,
    max_shard_size: int | str = "5GB",
    overwrite: bool = False,
    registry: Any = None,
    merge: bool = False,
) -> Path:
    """Write the HF form of native checkpoint ``src`` to ``out`` (atomically); returns ``out``.

    The weights are written by the converter the checkpoint's trainer backend registered
    (``checkpoint_converter``, see ``backend_converter``); ``registry`` defaults to the installed plugins.
    A LoRA checkpoint (``lora`` in ``trainer_meta.json``) becomes a PEFT adapter folder, or with
    ``merge`` the base model with the adapters merged into its weights.
    """
    src, out = Path(src), Path(out)
    limit = parse_size(max_shard_size)
    backend = _check_source(src)
    if merge and not read_trainer_meta(src).get("lora"):
        raise ConversionError(
            f"--merge merges LoRA adapters into the base model, but {src} is a full-model "
            "checkpoint (trained with lora_rank: 0); convert it without --merge"
        )
    if out.exists() and not overwrite:
        raise ConversionError(f"{out} already exists; choose another --out or pass --overwrite to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.converting-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    try:
        converter = backend_converter(backend, registry)
        converter(src, tmp, limit, merge=True) if merge else converter(src, tmp, limit)  # type: ignore[call-arg]
        if (src / HF_META_DIR).is_dir():
            copy_hf_meta(src / HF_META_DIR, tmp)
        if not (tmp / "config.json").is_file():
            raise ConversionError(f"{src} has no {HF_META_DIR}/config.json: the HF folder would not load")
        match_config_dtype(tmp)
        _move_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


#: safetensors dtype codes of floating-point tensors -> the names HF configs use.
_FLOAT_CODES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}
_CONFIG_DTYPE_KEYS = ("dtype", "torch_dtype")  # transformers >= 4.56 writes dtype, older torch_dtype


def stored_float_dtype(folder: str | Path) -> str | None:
    """The floating-point dtype holding most bytes in ``folder``'s ``*.safetensors`` (headers only)."""
    total: Counter[str] = Counter()
    for file in sorted(Path(folder).glob("*.safetensors")):
        with open(file, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for name, info in header.items():
            if name != "__metadata__" and info.get("dtype") in _FLOAT_CODES:
                start, end = info["data_offsets"]
                total[_FLOAT_CODES[info["dtype"]]] += end - start
    return total.most_common(1)[0][0] if total else None


def match_config_dtype(folder: str | Path) -> str | None:
    """Make ``folder/config.json`` name the dtype its weights are stored in; returns that dtype.

    Sets ``dtype`` (added when the config has neither key) and ``torch_dtype`` when present,
    also inside a nested ``text_config`` that names one. The file is rewritten only when a
    value changes.
    """
    dtype = stored_float_dtype(folder)
    path = Path(folder) / "config.json"
    if dtype is None or not path.is_file():
        return dtype
    config = json.loads(path.read_text())
    changed = _set_dtype(config, dtype, add=True)
    text = config.get("text_config")
    if isinstance(text, dict):
        changed = _set_dtype(text, dtype, add=False) or changed
    if changed:
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return dtype


def _set_dtype(config: dict[str, Any], dtype: str, *, add: bool) -> bool:
    keys = [k for k in _CONFIG_DTYPE_KEYS if k in config] or (["dtype"] if add else [])
    changed = False
    for key in keys:
        if config.get(key) != dtype:
            config[key] = dtype
            changed = True
    return changed


#: ``converter(src, out, max_shard_bytes)``: writes the HF weight files of checkpoint ``src`` into ``out``.
Converter = Callable[[Path, Path, int], None]


def backend_converter(backend: str, registry: Any = None) -> Converter:
    """The weight converter trainer backend ``backend`` registered (``checkpoint_converter="module:function"``).

    Each backend's package owns its checkpoint format: core only drives the conversion.
    """
    import importlib

    if registry is None:
        from telescope.core.plugins import load_plugins

        _, registry = load_plugins()
    target = None
    if registry.has("trainer_backend", backend):
        target = registry.get("trainer_backend", backend).meta.get("checkpoint_converter")
    if not target:
        raise NotImplementedError(
            f"converting checkpoints of trainer backend {backend!r} to HF format: its package registers no "
            "checkpoint_converter (is it installed?)"
        )
    module, _, name = str(target).partition(":")
    converter: Converter = getattr(importlib.import_module(module), name)
    return converter


def _check_source(src: Path) -> str:
    if not src.exists():
        raise ConversionError(f"{src} does not exist; give a step_<N> checkpoint folder or a folder of them")
    _check_not_hf(src)
    if not is_native_checkpoint(src):
        raise ConversionError(
            f"{src} is not a Telescope checkpoint (no trainer_meta.json); give a step_<N> folder written by training"
        )
    return checkpoint_backend(src)


def _check_not_hf(path: Path) -> None:
    if is_hf_checkpoint(path):
        raise ConversionError(
            f"{path} is already in Hugging Face format (config.json + weights): nothing to convert"
        )


def _move_into_place(tmp: Path, out: Path) -> None:
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:12]}"
        os.rename(out, old)
    os.rename(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def plan_shards(sizes: list[tuple[str, int]], limit: int) -> list[list[str]]:
    """Greedy, order-keeping split into shards of at most ``limit`` bytes (a larger tensor alone)."""
    shards: list[list[str]] = [[]]
    used = 0
    for name, size in sizes:
        if shards[-1] and used + size > limit:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += size
    return shards


def shard_file_names(count: int) -> list[str]:
    """HF names of ``count`` weight files: ``model.safetensors`` alone, else ``model-0000i-of-0000n.safetensors``."""
    if count == 1:
        return ["model.safetensors"]
    return [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def write_safetensors_shards(
    out: Path, sizes: list[tuple[str, int]], limit: int, read: Callable[[list[str]], dict[str, Any]]
) -> None:
    """Write the HF weight files of tensors ``sizes`` (``(name, bytes)``, in order) into ``out``.

    ``plan_shards`` splits them into files of at most ``limit`` bytes; ``read(names)`` returns
    one file's tensors by name, so memory stays near one shard. Several files get
    ``model.safetensors.index.json`` (``total_size``, ``weight_map``). torch is imported here.
    """
    from safetensors.torch import save_file

    shards = plan_shards(sizes, limit)
    files = shard_file_names(len(shards))
    weight_map: dict[str, str] = {}
    for names, file in zip(shards, files, strict=True):
        tensors = read(names)
        save_file(tensors, str(out / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, file))
        del tensors
    if len(files) > 1:
        index = {"metadata": {"total_size": sum(size for _, size in sizes)}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def convert_all(
    root: str | Path,
    out_root: str | Path,
    *,
    max_shard_size: int | str = "5GB",
    overwrite: bool = False,
    on_checkpoint: Callable[[ConvertResult], None] | None = None,
    merge: bool = False,
) -> list[ConvertResult]:
    """Convert every committed ``step_<N>`` under ``root`` to ``out_root/step_<N>``."""
    from telescope.core.checkpoint.manager import CheckpointManager

    root, out_root = Path(root), Path(out_root)
    if not root.is_dir():
        raise ConversionError(
            f"{root} does not exist or is not a folder; give a step_<N> checkpoint or a folder of them"
        )
    _check_not_hf(root)
    mgr = CheckpointManager(root)
    steps = mgr.steps()
    if not steps:
        raise ConversionError(f"{root} holds no committed checkpoint (step_<N> folder with meta.json)")
    results = []
    for step in steps:
        src, out = mgr.path(step), out_root / f"step_{step}"
        skipped = out.exists() and not overwrite
        if not skipped:
            convert_checkpoint(src, out, max_shard_size=max_shard_size, overwrite=overwrite, merge=merge)
        result = ConvertResult(src, out, skipped)
        if on_checkpoint is not None:
            on_checkpoint(result)
        results.append(result)
    return results
