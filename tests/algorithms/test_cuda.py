"""The same losses and logprobs on a CUDA device as on CPU (skipped without a GPU)."""

from __future__ import annotations

import pytest
import torch
from algorithms_reference import ALGORITHMS, Case, packed_batch
from helpers_torch import config_for, loss_inputs

from telescope.core.algorithms import get_algorithm, token_entropy, token_logprobs


@pytest.mark.gpu
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_policy_loss_on_cuda_matches_cpu(algorithm: str) -> None:
    batch = packed_batch(seed=2)
    cfg = config_for(Case(algorithm, use_tis=True, ppo_clip_ref_logprobs="batch"))
    cpu = loss_inputs(batch)
    out_cpu = get_algorithm(algorithm).policy_loss(cpu, cfg)
    out_cpu.loss.backward()
    gpu = loss_inputs(batch)
    for name in ("inference_logprobs", "old_logprobs", "advantages", "loss_mask", "position_ids"):
        setattr(gpu, name, getattr(gpu, name).cuda())
    leaf = gpu.logprobs.detach().cuda().requires_grad_(True)
    gpu.logprobs = leaf
    out_gpu = get_algorithm(algorithm).policy_loss(gpu, cfg)
    out_gpu.loss.backward()
    torch.testing.assert_close(out_gpu.loss.detach().cpu(), out_cpu.loss.detach(), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(leaf.grad.cpu(), cpu.logprobs.grad, rtol=1e-9, atol=1e-9)


@pytest.mark.gpu
def test_token_logprobs_and_entropy_on_cuda_match_cpu() -> None:
    logits = torch.randn(300, 1000, requires_grad=True)
    targets = torch.randint(0, 1000, (300,))
    cpu = token_logprobs(logits, targets, 0.8, 64)
    cpu.sum().backward()
    logits_gpu = logits.detach().cuda().requires_grad_(True)
    gpu = token_logprobs(logits_gpu, targets.cuda(), 0.8, 64)
    gpu.sum().backward()
    torch.testing.assert_close(gpu.detach().cpu(), cpu.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits_gpu.grad.cpu(), logits.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        token_entropy(logits_gpu, 0.8, 64).cpu(), token_entropy(logits, 0.8, 64), rtol=1e-5, atol=1e-5
    )
