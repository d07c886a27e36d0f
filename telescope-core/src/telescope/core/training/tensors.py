"""Packed micro-batches as tensors on the training device (shared by the trainer backends)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from telescope.core.algorithms.inputs import LossInputs
from telescope.core.packing import MicroBatch

__all__ = ["DeviceMicroBatch", "loss_inputs", "move_to_device", "prepare_tensors", "to_device"]


@dataclass
class DeviceMicroBatch:
    """One packed row on the training device.

    ``input_ids`` and ``position_ids`` are ``[1, L]`` model inputs. The other tensors are 1-D
    and already shifted to the ``L - 1`` target tokens (element t describes token t + 1, the
    one predicted from position t), the layout ``LossInputs`` expects.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    targets: torch.Tensor
    target_position_ids: torch.Tensor
    loss_mask: torch.Tensor
    inference_logprobs: torch.Tensor
    advantages: torch.Tensor
    num_samples: int
    num_loss_tokens: int


def loss_inputs(
    mb: DeviceMicroBatch,
    logprobs: torch.Tensor,
    counts: tuple[float, float],
    *,
    old_logprobs: torch.Tensor | None,
    entropy: torch.Tensor | None,
    kl_sum: torch.Tensor | None = None,
) -> LossInputs:
    """``mb``'s ``LossInputs`` with the trainer's ``logprobs``; ``counts`` are the whole minibatch's
    (loss tokens, samples), the losses' denominators."""
    return LossInputs(
        logprobs=logprobs,
        inference_logprobs=mb.inference_logprobs,
        advantages=mb.advantages,
        loss_mask=mb.loss_mask,
        position_ids=mb.target_position_ids,
        num_loss_tokens=counts[0],
        num_samples=counts[1],
        old_logprobs=old_logprobs,
        entropy=entropy,
        kl_sum=kl_sum,
    )


def prepare_tensors(mb: MicroBatch) -> dict[str, torch.Tensor]:
    """Host tensors of ``mb``'s fields (``timing_prepare_tensors``): ids, positions, and the
    per-target mask, rollout logprobs and advantages (shifted by one)."""
    return {
        "ids": torch.tensor(mb.input_ids, dtype=torch.long),
        "pos": torch.tensor(mb.position_ids, dtype=torch.long),
        "mask": torch.tensor(mb.loss_mask[1:], dtype=torch.float32),
        "lp": torch.tensor(mb.inference_logprobs[1:], dtype=torch.float32),
        "adv": torch.tensor(mb.advantages[1:], dtype=torch.float32),
    }


def move_to_device(mb: MicroBatch, host: dict[str, torch.Tensor], device: torch.device) -> DeviceMicroBatch:
    """``prepare_tensors``' output on ``device`` (``timing_data_to_device``: one copy per field)."""
    nb = device.type == "cuda"
    t = {k: v.to(device, non_blocking=nb) for k, v in host.items()}
    return DeviceMicroBatch(
        input_ids=t["ids"][None],
        position_ids=t["pos"][None],
        targets=t["ids"][1:],
        target_position_ids=t["pos"][1:],
        loss_mask=t["mask"],
        inference_logprobs=t["lp"],
        advantages=t["adv"],
        num_samples=mb.num_samples,
        num_loss_tokens=int(sum(mb.loss_mask[1:])),
    )


def to_device(mb: MicroBatch, device: torch.device) -> DeviceMicroBatch:
    """Build tensors for ``mb`` on ``device`` (one host-to-device copy per field)."""
    return move_to_device(mb, prepare_tensors(mb), device)
