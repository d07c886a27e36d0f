"""Run-level facts for ``LoggerHub.log_info``: the environments and their declared ranges.

The seed's ``reward_min``/``reward_max`` (config entries) and ``metrics_ranges`` (environment
classes) only tell charts their effective bounds; they are recorded in ``run.json``
``info.environments`` (and the W&B summary) with this shape. Duck-typed on
``telescope.core.env.base.Environment``: nothing is imported from the environment API.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["environment_info", "eval_info"]


def _dataset_size(env: Any) -> int | None:
    samples = getattr(env, "samples", None)
    if not callable(samples):
        return None
    return len(samples())


def environment_info(envs: Mapping[str, Any], cfg: TelescopeConfig | None = None) -> list[dict[str, Any]]:
    """One ``{name, weight, reward_min, reward_max, metrics_ranges, tags_options, dataset_size, multi_turn}`` per env.

    Args:
        envs: ``{name: environment}`` as the run built them (datasets loaded).
        cfg: the run config; its ``environments`` entries give the weights and, when set,
            ``reward_min``/``reward_max`` (else the environment's own attributes are used).
    """
    entries = {e.name: e for e in cfg.environments} if cfg is not None else {}
    out = []
    for name, env in envs.items():
        entry = entries.get(str(name))
        reward_min = getattr(entry, "reward_min", None)
        reward_max = getattr(entry, "reward_max", None)
        out.append(
            {
                "name": str(name),
                "weight": float(getattr(entry, "weight", 1.0)),
                "reward_min": reward_min if reward_min is not None else getattr(env, "reward_min", None),
                "reward_max": reward_max if reward_max is not None else getattr(env, "reward_max", None),
                **_declared(env),
            }
        )
    return out


def eval_info(envs: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One ``{name, reward_min, reward_max, metrics_ranges, tags_options, dataset_size, multi_turn}``
    per eval (``{name: environment}`` as the eval runner loaded them)."""
    return [
        {
            "name": str(name),
            "reward_min": getattr(env, "reward_min", None),
            "reward_max": getattr(env, "reward_max", None),
            **_declared(env),
        }
        for name, env in envs.items()
    ]


def _declared(env: Any) -> dict[str, Any]:
    """What an environment class declares for charts: metric ranges and the values of its tags."""
    return {
        "metrics_ranges": {
            str(k): dict(v) for k, v in dict(getattr(env, "metrics_ranges", {}) or {}).items()
        },
        "tags_options": {
            str(k): [str(x) for x in v] for k, v in dict(getattr(env, "tags_options", {}) or {}).items()
        },
        "dataset_size": _dataset_size(env),
        "multi_turn": bool(getattr(env, "is_multi_turn", False)),
    }
