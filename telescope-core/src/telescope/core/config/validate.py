"""Checks against the installed plugins: component names, their kwargs, algorithm rules."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from telescope.core.config.errors import problems_from_validation_error
from telescope.core.config.schema import TelescopeConfig
from telescope.core.registry import Registry, UnknownComponentError, did_you_mean

__all__ = ["component_problems", "default_advantage_norm", "registry_problems"]


def default_advantage_norm(raw: dict[str, Any], registry: Registry) -> str | None:
    """The advantage_norm the named algorithm wants when the user did not choose one."""
    name = raw.get("algorithm")
    if isinstance(name, str) and registry.has("algorithm", name):
        value = registry.get("algorithm", name).meta.get("default_advantage_norm")
        return value if isinstance(value, str) else None
    return None


def registry_problems(cfg: TelescopeConfig, registry: Registry) -> list[str]:
    """Every problem of ``cfg`` that needs the registry to see (empty when valid)."""
    problems = _model_problems(cfg.model) + _algorithm_problems(cfg, registry)
    problems += component_problems(
        registry, "trainer_backend", cfg.train_backend, "train_backend", cfg.train_backend_kwargs
    )
    problems += _lora_problems(cfg, registry)
    if cfg.inference_engine != "auto":
        problems += component_problems(
            registry,
            "inference_engine",
            cfg.inference_engine,
            "inference_engine",
            cfg.inference_engine_kwargs,
        )
    for i, env in enumerate(cfg.environments):
        problems += _entry_problems(registry, ("environment",), env.name, env.kwargs, f"environments[{i}]")
    for i, ev in enumerate(cfg.evals):
        problems += _entry_problems(registry, ("eval", "environment"), ev.name, ev.kwargs, f"evals[{i}]")
    return problems + _logger_problems(cfg, registry)


def _logger_problems(cfg: TelescopeConfig, registry: Registry) -> list[str]:
    """A logger turned on by its config bool (``use_tensorboard`` ...) whose package is missing."""
    problems = []
    for comp in registry.components("logger"):
        field = comp.meta.get("enabled_by")
        if field and getattr(cfg, field, False) and not comp.available:
            problems.append(
                f"{field}: true but the '{comp.name}' logger is unavailable ({comp.unavailable}); "
                f"install it or set {field}: false"
            )
    return problems


def _model_problems(model: str) -> list[str]:
    """A ``telescope/...`` name must be one of the built-in demo models (hub ids and paths pass)."""
    from telescope.core.models.tiny import PREFIX, TINY_MODEL_SPECS

    if not model.startswith(PREFIX) or model in TINY_MODEL_SPECS:
        return []
    names = sorted(TINY_MODEL_SPECS)
    return [
        f"model: unknown built-in model '{model}'.{did_you_mean(model, names)} Built-in models: {', '.join(names)}"
    ]


def _selectable(registry: Registry, kind: str, name: str, field: str) -> list[str]:
    try:
        component = registry.get(kind, name)
    except UnknownComponentError as exc:
        return [f"{field}: {exc}"]
    if not component.available:
        return [
            f"{field}: '{name}' (from {component.plugin.distribution}) is installed but unavailable: "
            f"{component.unavailable}"
        ]
    return []


def component_problems(
    registry: Registry, kind: str, name: str, field: str, kwargs: dict[str, Any]
) -> list[str]:
    """``{field}: ...`` when ``name`` is unknown or unavailable, else ``{field}_kwargs.x: ...`` per bad kwarg."""
    problems = _selectable(registry, kind, name, field)
    if problems:
        return problems
    return _invalid_kwargs(registry.get(kind, name), kwargs, f"{field}_kwargs")


def kwargs_problems(component: Any, exc: ValidationError, prefix: str) -> list[str]:
    """``problems_from_validation_error`` with a did-you-mean for unknown top-level kwargs."""
    problems = problems_from_validation_error(exc, prefix=prefix)
    fields = list(getattr(component.kwargs_model, "model_fields", {}))
    for e in exc.errors():
        if e["type"] == "extra_forbidden" and len(e["loc"]) == 1:
            line = f"{prefix}{e['loc'][0]}: unknown field."
            hint = did_you_mean(str(e["loc"][0]), fields)
            problems = [p + hint if p == line else p for p in problems]
    return problems


def _invalid_kwargs(component: Any, kwargs: dict[str, Any], label: str) -> list[str]:
    """What is wrong with ``kwargs`` for ``component``, each line prefixed with ``label`` (none: [])."""
    try:
        component.validate_kwargs(kwargs)
    except ValidationError as exc:
        return kwargs_problems(component, exc, f"{label}.")
    except TypeError as exc:
        return [f"{label}: {exc}"]
    return []


def _lora_problems(cfg: TelescopeConfig, registry: Registry) -> list[str]:
    """``lora_rank > 0`` needs a trainer backend that registered ``supports_lora=True``."""
    if cfg.lora_rank == 0 or not registry.has("trainer_backend", cfg.train_backend):
        return []
    if registry.get("trainer_backend", cfg.train_backend).meta.get("supports_lora", False):
        return []
    able = sorted(
        c.name for c in registry.components("trainer_backend") if c.meta.get("supports_lora", False)
    )
    return [
        f"lora_rank: {cfg.lora_rank} is not supported by train_backend '{cfg.train_backend}' (LoRA is not "
        f"implemented there yet); set lora_rank: 0 for full fine-tuning, or use train_backend: "
        f"{' or '.join(able) or 'fsdp'}"
    ]


def _algorithm_problems(cfg: TelescopeConfig, registry: Registry) -> list[str]:
    problems = _selectable(registry, "algorithm", cfg.algorithm, "algorithm")
    if problems:
        return problems
    meta = registry.get("algorithm", cfg.algorithm).meta
    if cfg.use_ppo_clip and not meta.get("supports_ppo_clip", True):
        problems.append(
            f"use_ppo_clip: true is invalid with algorithm '{cfg.algorithm}', which applies its own ratio "
            "weighting; set use_ppo_clip: false or use grpo, rloo, reinforce_pp or dr_grpo"
        )
    if cfg.use_tis and meta.get("uses_ratio", False) and cfg.ppo_clip_ref_logprobs == "rollout":
        problems.append(
            f"use_tis: true with algorithm '{cfg.algorithm}' and ppo_clip_ref_logprobs: rollout double-counts "
            f"the importance-sampling correction ('{cfg.algorithm}' already weights each token by its ratio "
            "to the rollout policy); set ppo_clip_ref_logprobs: batch (or use_tis: false)"
        )
    if cfg.distill_teacher_model is not None and not meta.get("token_advantages", True):
        problems.append(
            f"distill_teacher_model is set but algorithm '{cfg.algorithm}' uses one advantage per sequence, "
            "which would average the teacher's per-token signal away; use grpo, rloo, reinforce_pp, dr_grpo, "
            "cispo or sapo"
        )
    allowed = tuple(meta.get("advantage_norms", ("group", "batch")))
    if cfg.advantage_norm not in allowed:
        problems.append(
            f"advantage_norm: '{cfg.advantage_norm}' is invalid with algorithm '{cfg.algorithm}'; "
            f"allowed: {', '.join(allowed)} (set advantage_norm: {allowed[0]})"
        )
    return problems


def _entry_problems(
    registry: Registry, kinds: tuple[str, ...], name: str, kwargs: dict[str, Any], where: str
) -> list[str]:
    component = next((registry.get(k, name) for k in kinds if registry.has(k, name)), None)
    if component is None:
        valid = sorted({n for k in kinds for n in registry.names(k)})
        try:
            registry.get(kinds[0], name)
        except UnknownComponentError as exc:
            msg = str(exc)
        if len(kinds) > 1:
            msg += f" Environments usable as evals: {', '.join(valid) or '(none)'}."
        return [f"{where}.name: {msg}"]
    if not component.available:
        return [f"{where}.name: '{name}' is installed but unavailable: {component.unavailable}"]
    problems = _invalid_kwargs(component, kwargs, f"{where}.kwargs")
    if problems:
        return problems
    from telescope.core.env.resolve import environment_component_problems

    return [f"{where}: {p}" for p in environment_component_problems(component, kwargs, registry)]
