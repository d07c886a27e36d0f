"""Redirect megatron-core's hard-coded CUDA calls to CPU, for CPU tests of real Megatron modules.

Test-only and process-wide (it patches module globals), so the tests apply it inside spawned
worker processes only. Each patch names the Megatron code it stands in for:
- RoPE: ``torch.cuda.current_device()`` for ``inv_freq`` (rotary_pos_embedding.get_emb);
- default causal mask built with ``device="cuda"`` (fused_softmax / transformer.utils);
- attention dropout forks the CUDA RNG tracker (dot_product_attention);
- DDP grad sync waits on CUDA streams (param_and_grad_buffer.start_grad_sync);
- ``device="cuda"`` tensors in the optimizer, grad-scaler, schedules, grad-norm and utils modules;
- ``clip_grad_by_total_norm_fp32`` asserts ``torch.cuda.FloatTensor`` grads (same math on CPU).
- ``torch.cuda.synchronize`` / ``get_rng_state`` / ``set_rng_state`` (dist-checkpointing, our RNG files).
Gradient checkpointing (recompute) saves CUDA RNG states: CPU tests turn it off.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

__all__ = ["apply_cpu_shims"]


class _CPUTorch:
    """``torch`` with ``device="cuda"`` in tensor factories rewritten to ``"cpu"``."""

    FACTORIES = ("tensor", "zeros", "ones", "empty", "full")

    def __getattribute__(self, name: str) -> Any:
        attr = getattr(torch, name)
        if name not in _CPUTorch.FACTORIES:
            return attr

        def factory(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("device") == "cuda":
                kwargs["device"] = "cpu"
            return attr(*args, **kwargs)

        return factory


class _NoStream:
    def wait_event(self, event: Any) -> None:
        pass

    def wait_stream(self, stream: Any) -> None:
        pass


def _clip_cpu(parameters: Any, max_norm: float, total_norm: float, use_decoupled_grad: bool = False) -> None:
    coeff = min(1.0, max_norm / (float(total_norm) + 1.0e-6))
    for p in parameters:
        if p.grad is not None:
            p.grad.mul_(coeff)


def apply_cpu_shims() -> None:
    import megatron.core.fusions.fused_softmax as fused_softmax
    import megatron.core.optimizer.clip_grads as clip_grads
    import megatron.core.optimizer.grad_scaler as grad_scaler
    import megatron.core.optimizer.optimizer as optimizer
    import megatron.core.pipeline_parallel.schedules as schedules
    import megatron.core.utils as mutils
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    torch.cuda.current_stream = lambda *a, **k: _NoStream()  # type: ignore[assignment,return-value]
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()  # type: ignore[assignment]
    torch.cuda.set_rng_state = lambda *a, **k: None  # type: ignore[assignment]
    fused_softmax.get_default_causal_mask = lambda sq: torch.triu(torch.ones(sq, sq), diagonal=1).bool()
    get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()  # type: ignore[method-assign]
    for module in (optimizer, schedules, clip_grads, mutils, grad_scaler):
        module.torch = _CPUTorch()  # type: ignore[attr-defined]
    optimizer.clip_grad_by_total_norm_fp32 = _clip_cpu  # type: ignore[attr-defined]
