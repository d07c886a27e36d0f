"""Helpers for tests of Telescope and of third-party plugins."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from telescope.core import hookimpl
from telescope.core.config import TelescopeConfig
from telescope.core.plugins import PluginSet, build_registry, get_plugin_manager
from telescope.core.registry import PluginInfo, Registry

if TYPE_CHECKING:
    import pluggy

    from telescope.core.observe.rundir.records import RolloutRecord, TimelineEvent
    from telescope.core.rollouts.groups import RolloutGroup

__all__ = [
    "join_local_sync_group",
    "RunRecorder",
    "discarded_rows",
    "heavy_imports_after",
    "kept_group_rows",
    "make_config",
    "recording_hooks",
    "recording_plugin_manager",
    "registry_with",
    "smallest_run_settings",
]


def make_config(**overrides: Any) -> TelescopeConfig:
    """A schema-valid config with seed defaults, one environment, and ``overrides`` applied.

    Registry checks are not applied (use ``telescope.core.config.load_config`` for those).
    """
    overrides.setdefault("environments", [{"name": "reverse_text"}])
    return TelescopeConfig.model_validate(overrides)


def smallest_run_settings(**overrides: Any) -> dict[str, Any]:
    """Config settings of the smallest real run: 1 FSDP rank, 1 transformers server, the built-in tiny
    model on ``reverse_text``, local Ray, no wandb and no evals; ``overrides`` applied last."""
    return {
        "model": "telescope/tiny",
        "model_dtype": "float32",
        "mixed_precision_dtype": None,
        "environments": [{"name": "reverse_text"}],
        "inference_engine": "transformers",
        "inference_num_workers": 1,
        "trainer_num_workers": 1,
        "ray_inference_cpus_per_worker": 0.5,
        "ray_trainer_cpus_per_worker": 0.5,
        "ray_address": "local",
        "group_size": 4,
        "prompts_batch_size_for_trainer": 2,
        "max_async_rollout": 1,
        "max_tokens": 8,
        "seq_len": 256,
        "pad_to_multiple_of": 8,
        "learning_rate": 1e-3,
        "discard_group_zero_advantage": False,
        "use_wandb": False,
        "eval_before_training": False,
        "eval_after_training": False,
        "seed": 5,
        **overrides,
    }


def kept_group_rows(
    step: int, group_id: int, rewards: list[float], per_sample: Callable[[int, float], dict[str, Any]]
) -> list[RolloutRecord]:
    """Synthetic rollout records of one trained ``reverse_text`` group, as loggers receive them.

    Sample ``i`` has reward ``rewards[i]`` and its advantage against the group's mean, ran on server 0
    lane ``i`` with the weights of ``step - 1``, and stopped on ``length`` when ``i == 3`` (else
    ``stop``); ``per_sample(i, reward)`` gives its other fields (texts, completion ids, metrics).
    """
    from telescope.core.observe.rundir.records import RolloutRecord

    mean = sum(rewards) / len(rewards)
    return [
        RolloutRecord(
            step=step,
            group_id=group_id,
            env="reverse_text",
            sample_id=i,
            prompt_ids=[1, 2, 3],
            reward=r,
            advantage=r - mean,
            model_version=step - 1,
            stop_reason="length" if i == 3 else "stop",
            server=0,
            lane=i,
            **per_sample(i, r),
        )
        for i, r in enumerate(rewards)
    ]


def discarded_rows(step: int, group_id: int, reason: str, n: int = 1, **fields: Any) -> list[RolloutRecord]:
    """Synthetic records of ``n`` ``reverse_text`` rollouts of one group discarded for ``reason``."""
    from telescope.core.observe.rundir.records import RolloutRecord

    return [
        RolloutRecord(
            step=step, group_id=group_id, env="reverse_text", sample_id=i, discard_reason=reason, **fields
        )
        for i in range(n)
    ]


def heavy_imports_after(code: str, heavy: Sequence[str]) -> list[str]:
    """Which of the ``heavy`` modules a fresh interpreter has imported once it ran ``code``: a
    plugin module must import light (``[]``), its heavy dependencies only when a run needs them.
    ``code`` failing raises ``subprocess.CalledProcessError``."""
    probe = f"{code}\nimport json as _json, sys as _sys\n"
    probe += f"print(_json.dumps([m for m in {list(heavy)!r} if m in _sys.modules]))\n"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


def registry_with(*plugins: tuple[str, object], builtins: bool = True) -> tuple[PluginSet, Registry]:
    """A fresh registry from core built-ins (optional) plus in-test plugins ``(name, module_or_obj)``.

    Entry points are not loaded, so the result does not depend on what is installed.
    """
    pset = get_plugin_manager(load_entrypoints=False, block=() if builtins else _builtin_names())
    for name, plugin in plugins:
        pset.pm.register(plugin, name=name)
        pset.infos[name] = PluginInfo(name, getattr(plugin, "__name__", name), "tests", "0")
    return pset, build_registry(pset)


def _builtin_names() -> tuple[str, ...]:
    from telescope.core.plugins import BUILTIN_PLUGINS

    return tuple(name for name, _ in BUILTIN_PLUGINS)


@dataclass(eq=False)  # a plugin is registered by identity
class RunRecorder:
    """A plugin that keeps every run hook call (``hookspecs.py``), for tests of what a run reports."""

    groups: list[tuple[int, RolloutGroup]] = field(default_factory=list)
    """``(step, group)`` of every ``telescope_group_end``."""
    events: list[TimelineEvent] = field(default_factory=list)
    steps: list[dict[str, float]] = field(default_factory=list)
    """The ``metrics`` of every ``telescope_step_end``, in order."""
    rollouts: dict[int, list[RolloutRecord]] = field(default_factory=dict)
    """``telescope_step_end``'s ``rollouts`` by step."""
    evals: list[tuple[int, str, dict[str, float], list[dict[str, Any]]]] = field(default_factory=list)
    infos: list[dict[str, Any]] = field(default_factory=list)
    system: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    ends: list[str] = field(default_factory=list)
    """The ``status`` of every ``telescope_run_end``."""

    @hookimpl
    def telescope_group_end(self, group: RolloutGroup, step: int) -> None:
        self.groups.append((step, group))

    @hookimpl
    def telescope_events(self, events: list[TimelineEvent]) -> None:
        self.events.extend(events)

    @hookimpl
    def telescope_step_end(self, step: int, metrics: dict[str, float], rollouts: list[RolloutRecord]) -> None:
        self.steps.append(metrics)
        self.rollouts[step] = list(rollouts)

    @hookimpl
    def telescope_eval_end(
        self, step: int, name: str, metrics: dict[str, float], rows: list[dict[str, Any]]
    ) -> None:
        self.evals.append((step, name, metrics, rows))

    @hookimpl
    def telescope_run_info(self, info: dict[str, Any]) -> None:
        self.infos.append(info)

    @hookimpl
    def telescope_system_sample(self, sample: dict[str, Any]) -> None:
        self.system.append(sample)

    @hookimpl
    def telescope_warning(self, message: str) -> None:
        self.warnings.append(message)

    @hookimpl
    def telescope_run_end(self, status: str) -> None:
        self.ends.append(status)


def recording_hooks(*plugins: object) -> tuple[pluggy.HookRelay, RunRecorder]:
    """The run hooks of a plugin manager holding a ``RunRecorder`` and ``plugins`` (no other plugin).

    Pass the hook relay where a run component wants ``pm.hook`` (e.g. ``Orchestrator(..., hook)``).
    """
    pm, recorder = recording_plugin_manager(*plugins)
    return pm.hook, recorder


def recording_plugin_manager(*plugins: object) -> tuple[pluggy.PluginManager, RunRecorder]:
    """A plugin manager with the run hookspecs holding a ``RunRecorder`` and ``plugins`` (no other plugin)."""
    import pluggy

    from telescope.core import hookspecs

    pm = pluggy.PluginManager("telescope")
    pm.add_hookspecs(hookspecs)
    recorder = RunRecorder()
    for plugin in (recorder, *plugins):
        pm.register(plugin)
    return pm, recorder


def small_vllm_engine(**fields: Any) -> Any:
    """A vLLM engine sized for one GPU shared with a test or benchmark (bench/vllm_smoke.py and the vLLM
    GPU tests): the built-in tiny model, a 512-token context, 30% of GPU memory, no tracing, and
    eager mode (no CUDA-graph capture, so it starts in seconds). ``fields`` are config fields that
    win (e.g. ``lora_rank``); the run config is the engine's ``cfg``. Needs vLLM (GPU machines)."""
    from telescope.core.inference.settings import VllmEngineKwargs
    from telescope.core.inference.vllm_engine.engine import VllmEngine

    settings = {
        "model": "telescope/tiny",
        "inference_engine": "vllm",
        "inference_num_workers": 1,
        "max_model_len": 512,
        "gpu_memory_utilization": 0.3,
        "enable_vllm_tracing": False,
        **fields,
    }
    return VllmEngine(make_config(**settings), VllmEngineKwargs(extra_args=["--enforce-eager"]))


async def join_local_sync_group(client: Any, *, timeout_s: float = 300) -> Any:
    """Form a two-member weight-sync group over gloo on this host: this process is the trainer
    (rank 0) and the server behind ``client`` rank 1 (one GPU cannot hold two NCCL ranks). Returns
    the trainer's ``WeightSyncGroup`` (bench/vllm_smoke.py and the vLLM GPU tests)."""
    import asyncio

    from telescope.core.inference.protocol import WeightSyncInitRequest
    from telescope.core.weights import GroupSpec
    from telescope.core.weights.group import WeightSyncGroup, free_port
    from telescope.core.weights.settings import new_group_name

    spec = GroupSpec(
        host="127.0.0.1",
        port=free_port(),
        world_size=2,
        backend="gloo",
        timeout_s=timeout_s,
        group_name=new_group_name(),
    )
    init = asyncio.create_task(client.init_weight_sync(WeightSyncInitRequest(**spec.model_dump(), rank=1)))
    group = await asyncio.to_thread(WeightSyncGroup, spec, 0)
    await init
    return group
