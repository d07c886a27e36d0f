"""Per-token logprobs and entropies of targets under softmax(logits / T), chunked over rows.

Both functions touch the vocabulary dimension ``chunk_size`` rows at a time, so their
temporaries are O(chunk × vocab) instead of O(tokens × vocab). ``token_logprobs`` uses a
custom autograd function that keeps only the logits (already alive for the model's own
backward) and one log-sum-exp per row, and rebuilds the softmax chunk by chunk in the
backward pass; the plain ``log_softmax(...).gather(...)`` would save a full-size float32
copy of the logits for backward.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["token_entropy", "token_logprobs"]


def _chunks(num_rows: int, chunk_size: int) -> list[tuple[int, int]]:
    """Row ranges [start, end); ``chunk_size <= 0`` means a single chunk."""
    step = num_rows if chunk_size <= 0 else chunk_size
    return [(s, min(s + step, num_rows)) for s in range(0, num_rows, max(step, 1))]


def _check(logits: torch.Tensor, temperature: float, targets: torch.Tensor | None = None) -> None:
    if logits.dim() != 2:
        raise ValueError(f"logits must be [tokens, vocab], got shape {tuple(logits.shape)}")
    if targets is not None and targets.shape != logits.shape[:1]:
        raise ValueError(
            f"targets must be [tokens] = {tuple(logits.shape[:1])}, got shape {tuple(targets.shape)}"
        )
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 to compute training logprobs, got {temperature!r}")


class _TokenLogprobs(torch.autograd.Function):
    """ℓ_t = z_t[y_t] − logsumexp(z_t) with z = logits / T, in float32."""

    @staticmethod
    def forward(
        ctx: Any, logits: torch.Tensor, targets: torch.Tensor, temperature: float, chunk_size: int
    ) -> torch.Tensor:  # type: ignore[override]
        out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(out)
        for s, e in _chunks(logits.shape[0], chunk_size):
            z = logits[s:e].float() / temperature
            lse[s:e] = torch.logsumexp(z, dim=-1)
            out[s:e] = z.gather(-1, targets[s:e, None]).squeeze(-1) - lse[s:e]
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature = temperature
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:  # type: ignore[override]
        logits, targets, lse = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        t = ctx.temperature
        grad = torch.empty_like(logits)
        for s, e in _chunks(logits.shape[0], ctx.chunk_size):
            # dℓ/dlogits = (onehot(y) − softmax(z)) · g / T, built in place in one chunk buffer.
            g = grad_out[s:e].float()[:, None] / t
            probs = logits[s:e].float() / t
            probs.sub_(lse[s:e, None]).exp_()
            if grad.dtype == torch.float32:
                out = torch.mul(probs, -g, out=grad[s:e])
                out.scatter_add_(-1, targets[s:e, None], g)
            else:
                probs.mul_(-g).scatter_add_(-1, targets[s:e, None], g)
                grad[s:e] = probs.to(grad.dtype)
        return grad, None, None, None


def token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, chunk_size: int = 1024
) -> torch.Tensor:
    """Float32 logprobs [T] of ``targets`` [T] under softmax(``logits`` [T, V] / temperature).

    Differentiable with respect to ``logits``; ``chunk_size`` rows are processed at a time
    (``<= 0``: all rows at once).
    """
    _check(logits, temperature, targets)
    return _TokenLogprobs.apply(logits, targets.long(), float(temperature), int(chunk_size))  # type: ignore[no-any-return]


@torch.no_grad()
def token_entropy(logits: torch.Tensor, temperature: float = 1.0, chunk_size: int = 1024) -> torch.Tensor:
    """Float32 full-vocabulary entropy [T] of softmax(``logits`` / temperature), no grad, chunked."""
    _check(logits, temperature)
    out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    for s, e in _chunks(logits.shape[0], int(chunk_size)):
        logp = torch.log_softmax(logits[s:e].float() / temperature, dim=-1)
        out[s:e] = -(logp.exp() * logp).sum(dim=-1)
    return out
