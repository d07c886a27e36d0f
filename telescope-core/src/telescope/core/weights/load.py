"""Copy received tensors into a model's parameters, and verify what landed there."""

from __future__ import annotations

import torch

from telescope.core.weights.errors import WeightSyncError
from telescope.core.weights.fingerprint import algorithm_of, compare_fingerprints, fingerprint

__all__ = ["ModelWeightLoader"]


class ModelWeightLoader:
    """Maps Hugging Face parameter names to a model's tensors (tied weights share one tensor).

    ``check(named)`` validates names and shapes before anything is touched (so a bad update
    leaves the model intact); ``apply(named)`` copies in place (casting to the parameter's
    dtype and device); ``verify(named)`` fingerprints the model's tensors against what was
    received, cast the same way, and checks that every parameter was covered.
    """

    def __init__(self, model: torch.nn.Module, targets: dict[str, torch.Tensor] | None = None) -> None:
        """``targets``: the tensors a sync must cover, by wire name (default: the whole state dict;
        a LoRA server passes its adapters, ``telescope.core.weights.lora.adapter_parameters``)."""
        self.model = model
        self.targets: dict[str, torch.Tensor] = (
            dict(targets) if targets is not None else dict(model.state_dict(keep_vars=True))
        )
        self._param_ids = {id(p) for p in model.parameters()}

    def check(self, named: dict[str, torch.Tensor]) -> None:
        """Raise ``WeightSyncError`` for unknown names or shape mismatches (nothing is modified)."""
        unknown = sorted(set(named) - set(self.targets))
        if unknown:
            raise WeightSyncError(
                f"weight update names {len(unknown)} tensor(s) the inference model does not have: "
                f"{', '.join(unknown[:10])}; the trainer must send Hugging Face parameter names"
            )
        wrong = [
            f"{n} (got {tuple(t.shape)}, model has {tuple(self.targets[n].shape)})"
            for n, t in named.items()
            if tuple(t.shape) != tuple(self.targets[n].shape)
        ]
        if wrong:
            raise WeightSyncError(f"weight update has wrong shapes: {'; '.join(wrong[:10])}")
        covered = {id(self.targets[n]) for n in named}
        missing = sorted(
            n for n, t in self.targets.items() if id(t) in self._param_ids and id(t) not in covered
        )
        if missing:
            raise WeightSyncError(
                f"weight update leaves {len(missing)} parameter(s) unchanged: {', '.join(missing[:10])}"
            )

    @torch.no_grad()
    def apply(self, named: dict[str, torch.Tensor]) -> None:
        """Copy every tensor into the model (call ``check`` first)."""
        for name, tensor in named.items():
            self.targets[name].data.copy_(tensor)

    def verify(
        self, named: dict[str, torch.Tensor], where: str, received: dict[str, str] | None = None
    ) -> dict[str, str]:
        """Fingerprints of the model's tensors; raise if any differs from the received tensor.

        ``received``: fingerprints the receiver already took of ``named`` (reused where no cast
        happens, which saves hashing every received byte a second time).
        """
        expected, actual = {}, {}
        # the digest the receiver used (sum64 on CUDA groups, computed on the device)
        algorithm = algorithm_of(next(iter(received.values()))) if received else "xxh3"
        for name, tensor in named.items():
            target = self.targets[name].detach()
            if received is not None and name in received and tensor.dtype == target.dtype:
                expected[name] = received[name]
            else:
                expected[name] = fingerprint(tensor.to(dtype=target.dtype), algorithm)
            actual[name] = fingerprint(target, algorithm)
        compare_fingerprints(expected, actual, where=where)
        return actual
