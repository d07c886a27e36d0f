"""Prompt logprobs (vLLM's ``prompt_logprobs``): the model's logprob of every given prompt token.

A teacher in on-policy distillation is asked exactly this: the logprob of each token id it is
given, under its own distribution (temperature 1, as vLLM's default raw logprobs), not of tokens
it would sample. One right-padded forward per chunk of prompts, on the generation loop's thread
(``GenerationEngine.run_between_steps``), so it never races a decode step or a weight update.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["PromptTokenLogprob", "score_prompts"]

#: Most tokens (prompts x padded length) one forward scores: bounds the [tokens, vocab] logits.
TOKENS_PER_FORWARD = 2048


@dataclass(frozen=True)
class PromptTokenLogprob:
    """The model's judgement of one prompt token (from the tokens before it)."""

    token_id: int
    logprob: float
    rank: int
    """1 = the model's most likely token at that position."""
    top: list[tuple[int, float]] = field(default_factory=list)
    """The ``k`` most likely alternatives ``(id, logprob)``, most likely first (k = the request's
    ``prompt_logprobs``)."""


def score_prompts(
    model: Any, prompts: list[list[int]], top: int = 0
) -> list[list[PromptTokenLogprob | None]]:
    """Per prompt: None for its first token (nothing predicts it), then each token's logprob."""
    out: list[list[PromptTokenLogprob | None]] = []
    chunk: list[list[int]] = []
    for ids in prompts:
        longest = max([len(ids), *(len(c) for c in chunk)])
        if chunk and longest * (len(chunk) + 1) > TOKENS_PER_FORWARD:
            out += _score_chunk(model, chunk, top)
            chunk = []
        chunk.append(ids)
    if chunk:
        out += _score_chunk(model, chunk, top)
    return out


def _score_chunk(model: Any, prompts: list[list[int]], top: int) -> list[list[PromptTokenLogprob | None]]:
    import torch

    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, : len(p)] = torch.tensor(p, dtype=torch.long)
        mask[row, : len(p)] = 1
    ids, mask = ids.to(device), mask.to(device)
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1].float()
        logprobs = torch.log_softmax(logits, dim=-1)  # position t predicts token t + 1
        targets = ids[:, 1:]
        chosen = logprobs.gather(-1, targets[..., None])[..., 0]
        ranks = (logprobs > chosen[..., None]).sum(-1) + 1
        alternatives = logprobs.topk(top, dim=-1) if top else None
    chosen_l, ranks_l = chosen.cpu().tolist(), ranks.cpu().tolist()
    top_v = alternatives.values.cpu().tolist() if alternatives is not None else None
    top_i = alternatives.indices.cpu().tolist() if alternatives is not None else None
    result: list[list[PromptTokenLogprob | None]] = []
    for row, p in enumerate(prompts):
        scored: list[PromptTokenLogprob | None] = [None]
        for t in range(len(p) - 1):
            best = list(zip(top_i[row][t], top_v[row][t], strict=True)) if top_i and top_v else []
            scored.append(PromptTokenLogprob(p[t + 1], chosen_l[row][t], int(ranks_l[row][t]), best))
        result.append(scored)
    return result
