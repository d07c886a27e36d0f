"""Loss inputs/outputs and the ``Algorithm`` base class every RL algorithm derives from.

An algorithm is three things: stage-1 advantages per prompt group, optional stage-2 batch
normalisation, and a per-token policy loss. The base class owns what all of them share
(the reference logprobs, TIS, the aggregation over the whole minibatch, the metrics), so
a subclass only writes its own per-token loss ``token_losses``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from telescope.core.algorithms import advantages as adv
from telescope.core.algorithms import metrics as m
from telescope.core.algorithms.inputs import LossInputs
from telescope.core.algorithms.metrics import as_float

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["Algorithm", "LossInputs", "LossOutputs", "TokenLosses", "as_float", "log_ratio"]

#: r_t = exp(clamp(ℓ_t − ref_t, −RATIO_LOG_CLAMP, RATIO_LOG_CLAMP)).
RATIO_LOG_CLAMP = 20.0


@dataclass
class LossOutputs:
    """Result of ``policy_loss`` for one micro-batch."""

    loss: torch.Tensor
    """This micro-batch's share of the minibatch loss (0-d, with grad). Summing it over the
    micro-batches and ranks of a minibatch gives the minibatch loss exactly, so call
    ``loss.backward()`` on it as is and *sum* (not average) gradients across ranks."""
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)
    """Detached 0-d statistics to accumulate with ``telescope.core.algorithms.metrics.StepMetrics``:
    ``*_sum`` are sums over loss tokens (reported divided by ``loss_tokens``), ``*_min`` and
    ``*_max`` reduce by min/max, everything else (``loss``, ``loss_tokens``) is summed."""


@dataclass
class TokenLosses:
    """What a subclass's ``token_losses`` returns."""

    losses: torch.Tensor
    """L_t for every token (masked tokens may hold anything finite)."""
    clip_low: torch.Tensor | None = None
    """Bool per token: the lower clip bound is active (counted on loss tokens)."""
    clip_high: torch.Tensor | None = None
    """Bool per token: the upper clip bound is active (counted on loss tokens)."""


class Algorithm:
    """Base class: advantage estimation plus a policy loss over packed tokens.

    Subclasses set the class attributes and implement ``token_losses``; the group
    advantage estimator defaults to GRPO's z-score.
    """

    name: ClassVar[str] = ""
    #: Whether ``use_ppo_clip`` may be combined with this algorithm.
    supports_ppo_clip: ClassVar[bool] = True
    #: Allowed values of ``advantage_norm``.
    advantage_norms: ClassVar[tuple[str, ...]] = ("group", "batch")
    #: ``advantage_norm`` used when the user does not set one.
    default_advantage_norm: ClassVar[str] = "group"
    #: Whether ``token_losses`` reads the reference logprobs (ratio r_t) even without PPO clip.
    uses_ratio: ClassVar[bool] = False
    #: Whether ``token_losses`` reads each token's own advantage (on-policy distillation's per-token
    #: signal); False for a loss that averages the advantage over the sequence.
    supports_token_advantages: ClassVar[bool] = True

    # --- advantages ----------------------------------------------------------------
    def advantage_norm(self, cfg: TelescopeConfig) -> str:
        """The effective ``advantage_norm``, checked against what this algorithm allows."""
        norm = cfg.advantage_norm
        if norm not in self.advantage_norms:
            raise ValueError(
                f"advantage_norm '{norm}' is not supported by algorithm '{self.name}'; "
                f"allowed: {', '.join(self.advantage_norms)}"
            )
        return str(norm)

    def compute_advantages(self, rewards: Any, cfg: TelescopeConfig) -> torch.Tensor:
        """Stage-1 advantages of ``rewards`` [num_groups, group_size] (same shape)."""
        x = adv.as_rewards(rewards)
        if self.advantage_norm(cfg) == "batch":
            return adv.center(x)
        return self.group_advantages(x)

    def group_advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        """Stage 1 with ``advantage_norm == "group"``: (x − mean) / (std + 1e-4)."""
        return adv.zscore(rewards)

    def normalize_batch_advantages(self, advantages: Any, cfg: TelescopeConfig) -> torch.Tensor:
        """Stage 2 over every sample of one training batch (identity for group norm)."""
        a = adv.as_rewards(advantages, what="advantages", ndim=None)
        if self.advantage_norm(cfg) == "batch":
            return adv.whiten(a)
        return a

    # --- loss ----------------------------------------------------------------------
    def token_losses(self, inputs: LossInputs, ref: torch.Tensor | None, cfg: TelescopeConfig) -> TokenLosses:
        """Per-token loss L_t before TIS and aggregation. ``ref`` is None when not needed."""
        raise NotImplementedError(f"algorithm '{self.name}' does not implement token_losses")

    def aggregation_mode(self, cfg: TelescopeConfig) -> str:
        """How masked token losses are reduced; every algorithm supports ``token_mean``."""
        return "token_mean"

    def needs_reference(self, cfg: TelescopeConfig) -> bool:
        """True when the loss reads ref logprobs (a ratio): PPO clip or a ratio-based loss."""
        return self.uses_ratio or cfg.use_ppo_clip

    def policy_loss(self, inputs: LossInputs, cfg: TelescopeConfig) -> LossOutputs:
        """The micro-batch's share of the minibatch loss, plus its metrics."""
        _check_inputs(inputs, self.name)
        if cfg.use_ppo_clip and not self.supports_ppo_clip:
            raise ValueError(
                f"use_ppo_clip is not supported by algorithm '{self.name}'; set use_ppo_clip: false"
            )
        problem = tis_reference_problem(cfg, uses_ratio=self.needs_reference(cfg), algorithm=self.name)
        if problem:
            raise ValueError(problem)
        ref = reference_logprobs(inputs, cfg) if self.needs_reference(cfg) else None
        mask = inputs.loss_mask.to(torch.float32)
        out = self.token_losses(inputs, ref, cfg)
        losses = out.losses
        stats = m.base_metrics(inputs, mask)
        if cfg.use_tis:
            weights, capped = tis_weights(inputs, cfg, ref if self.needs_reference(cfg) else None)
            losses = losses * weights
            stats.update(m.tis_metrics(weights, capped, mask))
        stats.update(m.clip_metrics(out.clip_low, out.clip_high, mask))
        loss = (losses * mask).sum() / self.loss_denominator(inputs, cfg)
        stats["loss"] = loss.detach()
        return LossOutputs(loss=loss, metrics=stats)

    def loss_denominator(self, inputs: LossInputs, cfg: TelescopeConfig) -> torch.Tensor:
        """Minibatch-wide denominator of Σ m_t L_t for this algorithm's aggregation mode."""
        mode = self.aggregation_mode(cfg)
        if mode == "token_mean":
            return _at_least_one(inputs.num_loss_tokens)
        if mode == "token_sum_norm":
            return _at_least_one(inputs.num_samples) * float(cfg.max_tokens)  # the schema keeps it >= 1
        raise ValueError(f"unknown loss aggregation mode '{mode}' (algorithm '{self.name}')")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def reference_logprobs(inputs: LossInputs, cfg: TelescopeConfig) -> torch.Tensor:
    """ref = μ for ``ppo_clip_ref_logprobs == "rollout"``, else the batch ``old_logprobs``."""
    source = cfg.ppo_clip_ref_logprobs
    if source == "rollout":
        return inputs.inference_logprobs.detach()
    if source == "batch":
        if inputs.old_logprobs is None:
            raise ValueError(
                "ppo_clip_ref_logprobs is 'batch' but LossInputs.old_logprobs is None: the trainer "
                "must recompute logprobs before the step's first update and pass them"
            )
        return inputs.old_logprobs.detach()
    raise ValueError(f"ppo_clip_ref_logprobs must be 'rollout' or 'batch', got {source!r}")


def log_ratio(logprobs: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """clamp(ℓ − ref, −20, 20): the log of the importance ratio r_t."""
    return torch.clamp(logprobs - ref, -RATIO_LOG_CLAMP, RATIO_LOG_CLAMP)


def tis_weights(
    inputs: LossInputs, cfg: TelescopeConfig, ratio_ref: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """TIS weights sg(min(exp(clamp(p − μ, ±c)), cap)) and which tokens hit the cap.

    p is the policy the loss's own ratio does not already cover: the batch ``old_logprobs``
    when the loss has a ratio π/π_old (``ratio_ref``), so the product is π/π_old · min(π_old/μ, cap)
    and π/μ is counted once; the current ℓ for a ratio-free loss (plain REINFORCE).
    """
    c = float(cfg.tis_logprob_clamp)
    policy = inputs.logprobs if ratio_ref is None else ratio_ref
    delta = as_float(policy.detach() - inputs.inference_logprobs.detach())
    raw = torch.exp(torch.clamp(delta, -c, c))
    cap = float(cfg.tis_cap)
    return torch.clamp(raw, max=cap), raw > cap


def tis_reference_problem(cfg: TelescopeConfig, *, uses_ratio: bool, algorithm: str) -> str | None:
    """Why ``use_tis`` cannot run with this config, or None.

    A ratio-based loss (PPO clip, cispo, gspo, sapo) against the rollout logprobs already
    weights each token by π/μ; TIS would multiply in min(π/μ, cap) again.
    """
    if not (cfg.use_tis and uses_ratio):
        return None
    if cfg.ppo_clip_ref_logprobs != "rollout":
        return None
    what = "use_ppo_clip: true" if cfg.use_ppo_clip else f"algorithm '{algorithm}'"
    return (
        f"use_tis: true with {what} and ppo_clip_ref_logprobs: rollout double-counts the "
        "importance-sampling correction (the loss's ratio is already π/μ); set "
        "ppo_clip_ref_logprobs: batch (or use_tis: false)"
    )


def _at_least_one(value: int | float | torch.Tensor) -> torch.Tensor:
    return torch.clamp(torch.as_tensor(value, dtype=torch.float32), min=1.0)


def _check_inputs(inputs: LossInputs, algorithm: str) -> None:
    """Every per-token tensor must be 1-D and as long as ``logprobs``."""
    n = inputs.logprobs.shape
    if inputs.logprobs.dim() != 1:
        raise ValueError(f"LossInputs.logprobs must be 1-D packed tokens, got shape {tuple(n)}")
    for name in ("inference_logprobs", "advantages", "loss_mask", "position_ids", "old_logprobs", "entropy"):
        t = getattr(inputs, name)
        if t is not None and t.shape != n:
            raise ValueError(
                f"LossInputs.{name} has shape {tuple(t.shape)} but logprobs has {tuple(n)} "
                f"(algorithm '{algorithm}'): pass per-token tensors of one packed micro-batch"
            )
