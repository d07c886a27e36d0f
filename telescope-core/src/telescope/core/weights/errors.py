"""Weight-sync errors (no heavy imports: clients catch these)."""

from __future__ import annotations

__all__ = ["StaleWeightsError", "WeightSyncError", "WeightSyncMismatchError"]


class WeightSyncError(RuntimeError):
    """A weight sync could not complete (protocol, layout or loading problem)."""


class WeightSyncMismatchError(WeightSyncError):
    """The weights on the two sides of a sync differ; ``tensors`` names the ones that do."""

    def __init__(self, where: str, tensors: list[str], detail: str = "") -> None:
        self.where = where
        self.tensors = list(tensors)
        shown = ", ".join(self.tensors[:20]) + (
            f" (+{len(self.tensors) - 20} more)" if len(self.tensors) > 20 else ""
        )
        super().__init__(
            f"weight sync verification failed ({where}): {len(self.tensors)} tensor(s) differ: {shown}"
            + (f". {detail}" if detail else "")
            + ". The inference servers would generate with weights other than the trainer's; stopping."
        )


class StaleWeightsError(WeightSyncError):
    """A server sampled with a weight (adapter) version other than the ones it was synced to."""
