"""Turn the orchestrator's rollout groups into ``RolloutRecord`` rows.

Duck-typed on ``telescope.core.rollouts.groups.RolloutGroup``/``RolloutSample`` (read by
attribute name, not imported), so the observe package does not depend on the runtime.
"""

from __future__ import annotations

from typing import Any

from telescope.core.observe.rundir.records import RolloutRecord

__all__ = ["records_from_group"]


def _reward_details(info: dict[str, Any]) -> dict[str, Any]:
    """The ``RewardResult`` details and the environment's stop reason the runtime keeps in ``info``."""
    stop = info.get("stop_reason")
    return {
        "env_stop_reason": None if stop is None else str(stop),
        "golden_answers": dict(info.get("golden_answers") or {}),
        "info_turns": [dict(t) for t in info.get("info_turns") or []],
        "sample_tags": {str(k): str(v) for k, v in dict(info.get("sample_tags") or {}).items()},
    }


def _token_view(sample: Any) -> dict[str, Any]:
    """The token view's fields when the runtime decoded the completion token by token: sampler
    logprobs rounded to 4 decimals (enough to colour by; half the bytes of a full float), None
    where the loss mask says the environment wrote the token."""
    texts = getattr(sample, "completion_token_texts", None)
    if texts is None:
        return {}
    mask = sample.loss_mask or [1] * len(texts)
    logprobs = [
        round(float(lp), 4) if m else None for lp, m in zip(sample.inference_logprobs, mask, strict=True)
    ]
    return {"completion_token_texts": list(texts), "completion_logprobs": logprobs}


def records_from_group(
    group: Any,
    step: int,
    *,
    discard_reason: str | None = None,
    off_policy_steps: int | None = None,
) -> list[RolloutRecord]:
    """One record per sample of ``group`` for trainer step ``step``.

    Args:
        group: has ``group_id``, ``env_name``, ``sample_idx``, ``samples``, and optionally
            ``model_version``, ``discard_reason``, ``zero_advantage_kind``.
        discard_reason: overrides ``group.discard_reason`` (e.g. ``"off_policy"`` for a
            cancelled group).
        off_policy_steps: how many versions behind the policy the group was when used or dropped.
    """
    reason = discard_reason if discard_reason is not None else getattr(group, "discard_reason", None)
    kind = getattr(group, "zero_advantage_kind", None) if reason == "zero_advantage" else None
    group_version = int(getattr(group, "model_version", -1))
    rows = []
    for i, s in enumerate(group.samples):
        version = int(getattr(s, "model_version_start", -1))
        rows.append(
            RolloutRecord(
                step=int(step),
                group_id=int(group.group_id),
                env=str(group.env_name),
                sample_id=i,
                prompt_text=s.prompt_text,
                prompt_ids=list(s.prompt_ids),
                completion_text=s.completion_text,
                completion_ids=list(s.completion_ids),
                reward=float(s.reward),
                raw_reward=float(getattr(s, "raw_reward", s.reward)),
                sample_metrics={k: float(v) for k, v in dict(s.sample_metrics).items()},
                advantage=float(getattr(s, "advantage", 0.0)),
                model_version=version if version >= 0 else group_version,
                off_policy_steps=int(off_policy_steps or 0),
                stop_reason=str(s.finish_reason),
                discard_reason=reason,
                zero_advantage_kind=kind,
                server=int(getattr(s, "server", -1)),
                lane=int(getattr(s, "lane", -1)),
                timings=dict(getattr(s, "timings", {}) or {}),
                prompt_idx=int(getattr(group, "sample_idx", -1)),
                num_turns=int(getattr(s, "num_turns", 1)),
                **_reward_details(getattr(s, "info", None) or {}),
                segments=(getattr(s, "info", None) or {}).get("segments"),
                **_token_view(s),
            )
        )
    return rows
