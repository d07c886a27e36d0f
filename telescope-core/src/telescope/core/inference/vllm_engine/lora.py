"""The run's LoRA adapter as vLLM loads it: PEFT tensor names -> vLLM's module names, the PEFT folder
the worker extension writes at each sync. No vLLM import (tested on CPU; the contract tests check the
naming against vLLM's ``parse_fine_tuned_lora_name``).

vLLM (0.16-0.33) loads adapters only from a folder (``adapter_config.json`` + ``adapter_model.safetensors``,
PEFT's format) named by a ``LoRARequest``; ``load_inplace=True`` replaces the weights of an adapter
already loaded under the same name and id. So at each sync the worker writes the received tensors as
such a folder (``write_adapter``) and the guard asks vLLM to reload the run's adapter from it
(``guard.TelescopeGuard``, ``POST /telescope/lora/load``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["adapter_config", "adapter_target_modules", "prune_adapters", "vllm_lora_module", "write_adapter"]

_PEFT_PREFIX = "base_model.model."
ADAPTER_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"


def vllm_lora_module(name: str) -> tuple[str, bool]:
    """``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`` -> (``model.layers.0.self_attn.q_proj``,
    True): the module vLLM attaches the tensor to and whether it is ``lora_A`` (as vLLM's
    ``parse_fine_tuned_lora_name`` reads a PEFT name). vLLM then packs per-projection adapters into its
    fused layers (``q_proj``/``k_proj``/``v_proj`` -> ``qkv_proj``) itself."""
    parts = name.split(".")
    start = 2 if name.startswith(_PEFT_PREFIX) else 0
    if len(parts) - start >= 3 and parts[-1] == "weight" and parts[-2] in ("lora_A", "lora_B"):
        return ".".join(parts[start:-2]), parts[-2] == "lora_A"
    if len(parts) - start >= 2 and parts[-1] in ("lora_embedding_A", "lora_embedding_B"):
        return ".".join(parts[start:-1]), parts[-1] == "lora_embedding_A"
    raise ValueError(
        f"weight sync sent {name!r} to a LoRA server: not an adapter tensor under PEFT's names "
        "(<module>.lora_A.weight / .lora_B.weight); a LoRA run syncs only its adapters (lora_rank > 0 on "
        "the trainer and the servers alike)"
    )


def adapter_target_modules(names: Iterable[str]) -> list[str]:
    """The module names (last component) that carry adapters, sorted: ``adapter_config.json``'s
    ``target_modules`` (vLLM's loader does not resolve peft's ``all-linear``)."""
    return sorted({vllm_lora_module(n)[0].rsplit(".", 1)[-1] for n in names})


def adapter_config(cfg: Mapping[str, Any], names: Iterable[str]) -> dict[str, Any]:
    """``adapter_config.json`` of the run's adapter, from the resolved run config (a dict)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(cfg.get("model", "")),
        "r": int(cfg["lora_rank"]),
        "lora_alpha": float(cfg["lora_alpha"]),
        "lora_dropout": float(cfg.get("lora_dropout", 0.0)),
        "target_modules": adapter_target_modules(names),
        "bias": "none",
        "use_rslora": False,
        "use_dora": False,
    }


def write_adapter(
    root: str | Path, version: int, tensors: Mapping[str, Any], config: Mapping[str, Any]
) -> str:
    """Write ``tensors`` (PEFT names) and ``config`` as the PEFT folder ``<root>/v<version>``; returns its
    path. Written into a temporary folder and renamed, so vLLM never reads a half-written adapter."""
    from safetensors.torch import save_file

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"v{version}"
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".v{version}-"))
    try:
        cpu = {name: t.detach().to("cpu").contiguous() for name, t in tensors.items()}
        save_file(cpu, str(tmp / ADAPTER_FILE), metadata={"format": "pt"})
        (tmp / CONFIG_FILE).write_text(json.dumps(dict(config), indent=1))
        if final.exists():  # a sync of this version again (a retried sync): replace it
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return str(final)


def prune_adapters(root: str | Path, keep: Iterable[int]) -> None:
    """Remove the adapter folders ``<root>/v<N>`` whose version is not in ``keep``."""
    keep = set(keep)
    root = Path(root)
    if not root.is_dir():
        return
    for child in root.iterdir():
        name = child.name
        if child.is_dir() and name.startswith("v") and name[1:].isdigit() and int(name[1:]) not in keep:
            shutil.rmtree(child, ignore_errors=True)
