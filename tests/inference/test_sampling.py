"""Sampling and the batched KV cache of the transformers engine, against hand-computed values."""

from __future__ import annotations

import math

import torch

from telescope.core.inference.transformers_engine.kv import BatchCache
from telescope.core.inference.transformers_engine.sampling import SamplingParams, sample_next


def test_inverse_cdf_sampling_and_logprobs_by_hand() -> None:
    probs = [0.5, 0.3, 0.2]
    logits = torch.log(torch.tensor([probs, probs]))
    params = [SamplingParams(temperature=1.0), SamplingParams(temperature=1.0)]
    tokens, logprobs = sample_next(logits, params, torch.tensor([0.45, 0.85]))
    assert tokens.tolist() == [0, 2]  # cdf 0.5, 0.8, 1.0
    assert torch.allclose(logprobs, torch.tensor([math.log(0.5), math.log(0.2)]))


def test_temperature_scales_logprobs_and_zero_is_greedy() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0]])
    params = [SamplingParams(temperature=0.5), SamplingParams(temperature=0.0)]
    tokens, logprobs = sample_next(logits, params, torch.tensor([0.0, 0.99]))
    assert tokens.tolist() == [0, 1]
    scaled = torch.tensor([4.0, 2.0, 0.0])
    expected0 = scaled[0] - torch.logsumexp(scaled, 0)
    expected1 = 3.0 - torch.logsumexp(torch.tensor([0.0, 3.0, 1.0]), 0)
    assert torch.allclose(logprobs, torch.stack([expected0, expected1]))


def test_top_p_restricts_sampling_but_not_the_logprob() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    # top_p 0.7: nucleus {0, 1} (0.5 < 0.7, 0.8 crosses it). u=0.99 lands on the last kept token.
    tokens, logprobs = sample_next(probs.log(), [SamplingParams(top_p=0.7)], torch.tensor([0.99]))
    assert tokens.tolist() == [1]
    assert math.isclose(logprobs.item(), math.log(0.3), rel_tol=1e-6)  # not log(0.3 / 0.8)
    for u in torch.linspace(0, 0.999, 50):
        token, _ = sample_next(probs.log(), [SamplingParams(top_p=0.7)], u.reshape(1))
        assert token.item() in (0, 1)


def test_batch_cache_join_select_and_trim() -> None:
    def cache(rows: int, length: int, fill: float) -> BatchCache:
        kv = torch.full((rows, 1, length, 2), fill)
        return BatchCache([(kv, kv.clone())], torch.ones(rows, length, dtype=torch.long))

    a, b = cache(1, 2, 1.0), cache(2, 4, 2.0)
    a.join(b)
    assert a.mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]]
    assert a.layers[0][0][0, 0, :, 0].tolist() == [0.0, 0.0, 1.0, 1.0]
    a.select([0])  # the short row alone: its two padding columns are dropped
    assert a.mask.tolist() == [[1, 1]] and a.layers[0][0].shape == (1, 1, 2, 2)
