"""Chunked token logprobs/entropy against the plain full-vocabulary formulas."""

from __future__ import annotations

import pytest
import torch

from telescope.core.algorithms import token_entropy, token_logprobs


def _reference_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.log_softmax(logits.double() / temperature, dim=-1).gather(-1, targets[:, None]).squeeze(-1)


@pytest.mark.parametrize("chunk_size", [0, 1, 3, 7, 1024])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_values_and_gradients_match_log_softmax(chunk_size: int, temperature: float) -> None:
    g = torch.Generator().manual_seed(chunk_size)
    logits = (3 * torch.randn(11, 37, generator=g)).requires_grad_(True)
    targets = torch.randint(0, 37, (11,), generator=g)
    upstream = torch.randn(11, generator=g)

    got = token_logprobs(logits, targets, temperature, chunk_size)
    assert got.shape == (11,) and got.dtype == torch.float32
    (got * upstream).sum().backward()
    grad = logits.grad.clone()

    logits.grad = None
    expected = _reference_logprobs(logits, targets, temperature)
    (expected * upstream.double()).sum().backward()
    torch.testing.assert_close(got.double(), expected.detach(), rtol=0, atol=1e-5)
    torch.testing.assert_close(grad, logits.grad, rtol=1e-5, atol=1e-6)  # float32 arithmetic


def test_gradcheck_in_float64() -> None:
    logits = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([0, 4, 2, 2, 1, 3])
    # The forward computes in float32; check the backward formula against the float32 forward.
    assert torch.autograd.gradcheck(
        lambda x: token_logprobs(x, targets, 0.8, 4).double(), (logits,), eps=1e-3, atol=1e-3, rtol=1e-3
    )


def test_bfloat16_logits_get_bfloat16_gradients() -> None:
    logits = torch.randn(9, 40).to(torch.bfloat16).requires_grad_(True)
    targets = torch.randint(0, 40, (9,))
    got = token_logprobs(logits, targets, 1.0, 4)
    torch.testing.assert_close(
        got.double(), _reference_logprobs(logits.detach().float(), targets, 1.0), atol=1e-5, rtol=0
    )
    got.sum().backward()
    assert logits.grad.dtype == torch.bfloat16


def test_saves_no_vocabulary_sized_copy_for_backward() -> None:
    """Only the logits themselves (already alive) and O(T) tensors are kept for backward."""
    tokens, vocab = 64, 500
    logits = torch.randn(tokens, vocab, requires_grad=True)
    targets = torch.randint(0, vocab, (tokens,))
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        token_logprobs(logits, targets, 0.7, 16)
    foreign = [t for t in saved if t.numel() >= vocab and t.data_ptr() != logits.data_ptr()]
    assert foreign == []
    # The naive formula does keep a full [T, V] float tensor: the check above can fail.
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _reference_logprobs(logits, targets, 0.7)
    assert any(t.numel() >= tokens * vocab and t.data_ptr() != logits.data_ptr() for t in saved)


@pytest.mark.parametrize("chunk_size", [0, 2, 5, 100])
def test_entropy_matches_definition(chunk_size: int) -> None:
    logits = (2 * torch.randn(7, 30)).requires_grad_(True)
    got = token_entropy(logits, 0.9, chunk_size)
    p = torch.softmax(logits.detach().double() / 0.9, dim=-1)
    torch.testing.assert_close(got.double(), -(p * p.log()).sum(-1), rtol=0, atol=1e-5)
    assert not got.requires_grad
    # Uniform logits: entropy is log V.
    assert token_entropy(torch.zeros(2, 30), 1.0, 1).tolist() == pytest.approx(
        [torch.log(torch.tensor(30.0)).item()] * 2
    )


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="temperature must be > 0"):
        token_logprobs(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), 0.0, 4)
    with pytest.raises(ValueError, match=r"logits must be \[tokens, vocab\]"):
        token_entropy(torch.zeros(2, 3, 4), 1.0, 4)
    with pytest.raises(ValueError, match="targets must be"):
        token_logprobs(torch.zeros(2, 3), torch.zeros(3, dtype=torch.long), 1.0, 4)
