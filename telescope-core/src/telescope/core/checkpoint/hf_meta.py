"""``hf_meta/``: the base model's Hugging Face config, generation config and tokenizer files.

Written by trainer rank 0 into every checkpoint (FSDP and Megatron), so a checkpoint converts
to a complete HF folder offline. A local model folder is copied file by file (byte-exact: no
re-serialisation by another transformers version); a hub id goes through ``from_pretrained``
/ ``save_pretrained`` (from the local HF cache). transformers is imported lazily.
"""

from __future__ import annotations

import fnmatch
import logging
import shutil
from pathlib import Path

__all__ = ["HF_META_PATTERNS", "copy_hf_meta", "write_hf_meta"]

logger = logging.getLogger(__name__)

#: Non-weight files of a model folder that describe the model and its tokenizer.
HF_META_PATTERNS = (
    "config.json",
    "generation_config.json",
    "tokenizer*",
    "special_tokens_map.json",
    "vocab.*",
    "merges.txt",
    "added_tokens.json",
    "chat_template.*",
    "preprocessor_config.json",
    "*.tiktoken",
    "*.py",  # remote-code models (auto_map) need their modelling files next to config.json
)


def _is_meta_file(name: str) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in HF_META_PATTERNS)


def copy_hf_meta(src: str | Path, out_dir: str | Path) -> list[str]:
    """Copy the metadata files (not weights) of folder ``src`` into ``out_dir``; returns names."""
    src, out = Path(src), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    copied = []
    for file in sorted(src.iterdir()):
        if file.is_file() and _is_meta_file(file.name):
            shutil.copy2(file, out / file.name)
            copied.append(file.name)
    return copied


def write_hf_meta(model_path: str, out_dir: str | Path) -> Path:
    """Write ``model_path``'s config, generation config and tokenizer into ``out_dir``.

    ``model_path`` is a local folder, a built-in ``telescope/...`` name or a hub id. A model
    without a tokenizer or generation config simply gets none (logged at debug level).
    """
    from telescope.core.models.tiny import resolve_model_path

    out = Path(out_dir)
    local = Path(resolve_model_path(model_path))
    if local.is_dir():
        if "config.json" not in copy_hf_meta(local, out):
            raise FileNotFoundError(f"{local} has no config.json: it is not a Hugging Face model folder")
        return out
    _save_from_hub(model_path, out)
    return out


def _save_from_hub(model_id: str, out: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    out.mkdir(parents=True, exist_ok=True)
    AutoConfig.from_pretrained(model_id).save_pretrained(out)
    try:
        GenerationConfig.from_pretrained(model_id).save_pretrained(out)
    except OSError:
        logger.debug("%s has no generation_config.json", model_id)
    try:
        AutoTokenizer.from_pretrained(model_id).save_pretrained(out)
    except (OSError, ValueError) as exc:
        logger.warning("no tokenizer saved for %s (%s): the converted model will need one", model_id, exc)
