"""An independent NumPy (float64) reference of the algorithms issue's formulas.

Written from the issue text only; it shares no code with ``telescope.core.algorithms``.
Stop-gradient is modelled explicitly: every sg(·) quantity is computed from ``lp_sg``, a
frozen copy of the logprobs, so finite differences in ``lp`` alone give the gradient the
implementation must have.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

REINFORCE_FAMILY = ("grpo", "rloo", "reinforce_pp", "dr_grpo")
RATIO_ALGORITHMS = ("cispo", "gspo", "sapo")
ALGORITHMS = (*REINFORCE_FAMILY, *RATIO_ALGORITHMS)


@dataclass(frozen=True)
class Case:
    """One point of the combination grid, with the config fields the loss reads."""

    algorithm: str
    use_ppo_clip: bool = False
    ppo_clip_ref_logprobs: str = "rollout"
    use_tis: bool = False
    dr_grpo_loss_agg_mode: str = "token_mean"
    advantage_norm: str = "group"
    clip_low: float = 0.2
    clip_high: float = 0.28
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05
    tis_cap: float = 1.2
    tis_logprob_clamp: float = 0.25
    max_tokens: int = 40

    @property
    def id(self) -> str:
        return (
            f"{self.algorithm}-ppo{int(self.use_ppo_clip)}-{self.ppo_clip_ref_logprobs}"
            f"-tis{int(self.use_tis)}-{self.dr_grpo_loss_agg_mode}"
        )

    @property
    def has_ratio(self) -> bool:
        """The loss weights tokens by π/ref: PPO clip or a ratio algorithm."""
        return self.use_ppo_clip or self.algorithm in RATIO_ALGORITHMS

    @property
    def valid(self) -> bool:
        """TIS on top of a ratio to the rollout policy counts π/μ twice: refused."""
        return not (self.use_tis and self.has_ratio and self.ppo_clip_ref_logprobs == "rollout")


def advantages(rewards: np.ndarray, algorithm: str, norm: str) -> np.ndarray:
    """Stage 1, group by group, exactly as the issue lists it."""
    x = np.asarray(rewards, dtype=np.float64)
    n = x.shape[1]
    out = np.zeros_like(x)
    for g, r in enumerate(x):
        mean = r.mean()
        if norm == "batch":
            out[g] = r - mean if n > 1 else r
        elif algorithm == "rloo":
            out[g] = (r - mean) * n / (n - 1) if n > 1 else 0.0
        elif algorithm == "dr_grpo":
            out[g] = r - mean
        else:
            out[g] = 0.0 if n == 1 else (r - mean) / (r.std(ddof=1) + 1e-4)
    return out


def whiten(a: np.ndarray) -> np.ndarray:
    """Stage 2 over the whole batch."""
    flat = np.asarray(a, dtype=np.float64).ravel()
    return ((flat - flat.mean()) / (flat.std(ddof=1) + 1e-4)).reshape(np.shape(a))


def segments(pos: np.ndarray) -> list[np.ndarray]:
    """Token indices of each packed sample (a sample starts at position 0)."""
    starts = [i for i in range(len(pos)) if pos[i] == 0 or i == 0]
    bounds = [*starts, len(pos)]
    return [np.arange(bounds[k], bounds[k + 1]) for k in range(len(starts))]


def token_losses(lp, lp_sg, mu, old, adv, mask, pos, case: Case) -> np.ndarray:
    """L_t (after TIS) for every token; masked tokens of a GSPO sample get 0."""
    ref = mu if case.ppo_clip_ref_logprobs == "rollout" else old
    lo, hi = 1 - case.clip_low, 1 + case.clip_high
    r = np.exp(np.clip(lp - ref, -20, 20))
    a = case.algorithm
    if a in REINFORCE_FAMILY:
        loss = np.maximum(-r * adv, -np.clip(r, lo, hi) * adv) if case.use_ppo_clip else -lp * adv
    elif a == "cispo":
        r_sg = np.exp(np.clip(lp_sg - ref, -20, 20))
        loss = -np.clip(r_sg, lo, hi) * adv * lp
    elif a == "gspo":
        loss = _gspo(lp, lp_sg, ref, adv, mask, pos, lo, hi)
    elif a == "sapo":
        tau = np.where(adv > 0, case.sapo_tau_pos, case.sapo_tau_neg)
        loss = -(1 / (1 + np.exp(-tau * (r - 1)))) * (4 / tau) * adv
    else:
        raise ValueError(a)
    if case.use_tis:
        # With a ratio π/π_old in the loss the TIS weight covers only π_old/μ; without one, π/μ.
        c = case.tis_logprob_clamp
        policy = old if case.has_ratio else lp_sg
        loss = loss * np.minimum(np.exp(np.clip(policy - mu, -c, c)), case.tis_cap)
    return loss


def _gspo(lp, lp_sg, ref, adv, mask, pos, lo, hi) -> np.ndarray:
    loss = np.zeros_like(lp)
    for seg in segments(pos):
        t_i = seg[mask[seg] > 0]
        if len(t_i) == 0:
            continue
        n_i = len(t_i)
        s_i = np.mean(lp_sg[t_i] - ref[t_i])
        a_hat = np.mean(adv[t_i])
        for t in t_i:
            lam = (lp[t] - ref[t]) / n_i - (lp_sg[t] - ref[t]) / n_i + s_i
            rho = np.exp(min(lam, 10.0))
            loss[t] = max(-rho * a_hat, -np.clip(rho, lo, hi) * a_hat)
    return loss


def loss(lp, lp_sg, mu, old, adv, mask, pos, case: Case, num_loss_tokens, num_samples) -> float:
    """Σ m_t L_t over the aggregation denominator."""
    total = np.sum(mask * token_losses(lp, lp_sg, mu, old, adv, mask, pos, case))
    if case.algorithm == "dr_grpo" and case.dr_grpo_loss_agg_mode == "token_sum_norm":
        return float(total / (num_samples * case.max_tokens))
    return float(total / num_loss_tokens)


def finite_difference_grad(lp, mu, old, adv, mask, pos, case: Case, num_loss_tokens, num_samples, h=1e-6):
    """Central differences of ``loss`` in each ℓ_t, holding the stop-gradient copy fixed."""
    grad = np.zeros_like(lp)
    for t in range(len(lp)):
        e = np.zeros_like(lp)
        e[t] = h
        up = loss(lp + e, lp, mu, old, adv, mask, pos, case, num_loss_tokens, num_samples)
        down = loss(lp - e, lp, mu, old, adv, mask, pos, case, num_loss_tokens, num_samples)
        grad[t] = (up - down) / (2 * h)
    return grad


def kl_inference(lp, mu, mask) -> float:
    d = lp - mu
    return float(np.sum(mask * (np.exp(d) - 1 - d)) / max(mask.sum(), 1))


def packed_batch(seed: int, lengths=(9, 14, 6, 11), prompt=(3, 5, 2, 4), pad: int = 3, per_sample_adv=False):
    """Random packed inputs: samples of ``lengths`` whose first ``prompt`` tokens are masked,
    then ``pad`` padding tokens; logprob gaps of ~0.3 nats so that clip bounds bind sometimes."""
    rng = np.random.default_rng(seed)
    pos = np.concatenate([np.arange(n) for n in lengths] + [np.arange(pad)]).astype(np.int64)
    mask = np.concatenate(
        [np.r_[np.zeros(p), np.ones(n - p)] for n, p in zip(lengths, prompt, strict=True)] + [np.zeros(pad)]
    )
    total = len(pos)
    lp = -np.abs(rng.normal(1.0, 0.6, total))
    if per_sample_adv:
        adv = np.concatenate([np.full(n, rng.normal()) for n in lengths] + [np.zeros(pad)])
    else:
        adv = rng.normal(0.0, 1.0, total)
    return {
        "lp": lp,
        "mu": lp + rng.normal(0.0, 0.3, total),
        "old": lp + rng.normal(0.0, 0.3, total),
        "adv": adv,
        "mask": mask,
        "pos": pos,
        "num_samples": len(lengths),
    }
