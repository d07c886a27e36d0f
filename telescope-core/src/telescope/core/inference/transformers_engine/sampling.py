"""Sampling and logprobs, batched over the running sequences.

The logprob of a sampled token is ``log_softmax(logits / temperature)[token]``: temperature
scaled, *without* top-p renormalisation. That is what the trainer recomputes, so the
importance ratio between inference and training is 1 when the weights agree.
Temperature 0 means greedy decoding; its logprob uses the unscaled logits (temperature 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["SamplingParams", "sample_next", "top_logprobs"]


@dataclass(frozen=True)
class SamplingParams:
    """Per-sequence sampling settings."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 16
    stop_token_ids: frozenset[int] = frozenset()
    seed: int | None = None
    ignore_eos: bool = False
    top_logprobs: int = 0
    """Alternatives reported per sampled token (0: only the sampled token's logprob)."""
    stop: tuple[str, ...] = ()
    """Stop strings: the sample ends with the token that completes one (the token is kept)."""


def sample_next(
    logits: torch.Tensor, params: list[SamplingParams], uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of ``logits`` [B, V]; returns (tokens [B], logprobs [B]).

    ``uniforms`` [B] in [0, 1) drive inverse-CDF sampling, so the caller owns the randomness
    (per-request seeds, an engine-wide generator otherwise). Which rows are greedy or top-p is
    decided on the host: no device sync per step, and no mask built when every row agrees.
    """
    logits = logits.float()
    logprobs = _scaled_logprobs(logits, params)
    greedy = [p.temperature <= 0 for p in params]
    if all(greedy):  # all greedy: no sampling kernels
        tokens = logits.argmax(dim=-1)
        return tokens, logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)
    probs = logprobs.exp()
    if any(p.top_p < 1 for p in params):
        top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=logits.device)
        probs = _top_p_filter(probs, top_p)
    cdf = probs.cumsum(dim=-1)
    targets = uniforms.to(cdf.device).unsqueeze(1) * cdf[:, -1:]
    tokens = torch.searchsorted(cdf, targets, right=True).squeeze(1).clamp_(max=logits.shape[-1] - 1)
    if any(greedy):
        mask = torch.tensor(greedy, device=logits.device)
        tokens = torch.where(mask, logits.argmax(dim=-1), tokens)
    return tokens, logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)


def _scaled_logprobs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """log_softmax of the temperature-scaled logits [B, V] (greedy rows unscaled)."""
    temps = [p.temperature if p.temperature > 0 else 1.0 for p in params]
    scaled = logits.float()
    if any(t != 1.0 for t in temps):  # temperature 1 (or greedy) everywhere: nothing to divide
        scaled = scaled / torch.tensor(temps, dtype=torch.float32, device=logits.device).unsqueeze(1)
    return torch.log_softmax(scaled, dim=-1)


def top_logprobs(logits: torch.Tensor, params: list[SamplingParams]) -> list[list[tuple[int, float]]]:
    """Per row, the ``params[row].top_logprobs`` most likely tokens and their logprobs (the sampled
    token's definition: temperature scaled, before top-p), most likely first; empty where 0."""
    wanted = [row for row, p in enumerate(params) if p.top_logprobs > 0]
    out: list[list[tuple[int, float]]] = [[] for _ in params]
    if not wanted:
        return out
    rows = torch.tensor(wanted, dtype=torch.long, device=logits.device)
    logprobs = _scaled_logprobs(logits[rows], [params[r] for r in wanted])
    k = min(max(params[r].top_logprobs for r in wanted), logprobs.shape[-1])
    values, ids = logprobs.topk(k, dim=-1)
    for i, row in enumerate(wanted):
        n = params[row].top_logprobs
        out[row] = list(zip(ids[i, :n].tolist(), values[i, :n].tolist(), strict=True))
    return out


def _top_p_filter(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Zero the tail of each row beyond its nucleus (the token crossing top_p is kept)."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    keep_sorted = mass_before < top_p.unsqueeze(1)
    keep = torch.zeros_like(keep_sorted).scatter_(1, order, keep_sorted)
    return probs * keep
