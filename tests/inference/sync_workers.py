"""Process entry points of the weight-sync tests (imported by name in spawned children)."""

from __future__ import annotations

from typing import Any

import torch

from telescope.core.weights import GroupSpec, WeightSyncSettings
from telescope.core.weights.group import WeightSyncGroup
from telescope.core.weights.receiver import WeightReceiver
from telescope.core.weights.sender import WeightSender

#: The group name these tests use on both sides (a server joins only a name with a nonce).
GROUP = "telescope-weights-" + "5" * 32

#: (mode, version) of each sync in the group test; v4 carries a corrupted byte, v5 follows it.
PLAN = [
    ("flattened_bucket", 1),
    ("per_tensor", 2),
    ("flattened_bucket", 3),
    ("flattened_bucket", 4),
    ("flattened_bucket", 5),
]
CORRUPTED = ("layer.bias", 4)


def example_tensors(version: int) -> list[tuple[str, torch.Tensor]]:
    """Mixed dtypes, odd sizes (alignment), a 0-dim tensor and one tensor above the direct threshold."""
    gen = torch.Generator().manual_seed(version)
    return [
        ("layer.weight", torch.randn(33, 17, generator=gen)),
        ("layer.bias", torch.randn(17, generator=gen).to(torch.bfloat16)),
        ("counts", torch.randint(0, 1000, (5,), generator=gen)),
        ("big.weight", torch.randn(600, 1000, generator=gen)),
        ("scale", torch.tensor(float(version))),
        ("half", torch.randn(3, 3, generator=gen).to(torch.float16)),
    ]


class CorruptingSender(WeightSender):
    """Puts one wrong byte on the wire for one bucketed tensor while fingerprinting the true tensor:
    what a silent transfer bug would do."""

    corrupt_name: str | None = None

    def _fill_flat(self, flat: torch.Tensor, meta: Any, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        flat = super()._fill_flat(flat, meta, tensors)
        for slot in meta.flat:
            if slot.name == self.corrupt_name:
                flat[slot.offset] ^= 0xFF
        return flat


def group_worker(rank: int, port: int, world: int, queue: Any) -> None:
    """Rank 0 sends PLAN; the others receive and report what they got."""
    torch.set_num_threads(1)
    group = WeightSyncGroup(GroupSpec(host="127.0.0.1", port=port, world_size=world, timeout_s=120), rank)
    if rank == 0:
        senders = {
            m: CorruptingSender(group, WeightSyncSettings(mode=m, bucket_mb=1)) for m in {m for m, _ in PLAN}
        }
        for mode, version in PLAN:
            senders[mode].corrupt_name = CORRUPTED[0] if version == CORRUPTED[1] else None
            report = senders[mode].send(iter(example_tensors(version)), version)
            counts = (report.num_broadcasts, report.num_meta_sent, report.num_combined)
            queue.put(("sent", version, counts, report.fingerprints))
        return
    receiver = WeightReceiver(group)
    for _, version in PLAN:
        got = receiver.receive_all()
        expected = example_tensors(version)
        same = [n for n, t in expected if n in got and got[n].dtype == t.dtype and torch.equal(got[n], t)]
        assert receiver.last_sync is not None
        received = receiver.last_sync.received_fingerprints
        queue.put(("got", rank, version, list(got), same, got["big.weight"].data_ptr(), received))


def perturbed_state(model_path: str, seed: int) -> dict[str, torch.Tensor]:
    """The tiny model's weights plus seeded noise: "the trainer's new weights"."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.5 * torch.randn(param.shape, generator=gen) * param.std().clamp(min=0.02))
    return model.state_dict()


def trainer_worker(port: int, versions: list[tuple[str, int]], model_path: str, queue: Any) -> None:
    """A trainer rank 0: sends perturbed weights once per (mode, version)."""
    torch.set_num_threads(1)
    group = WeightSyncGroup(
        GroupSpec(host="127.0.0.1", port=port, world_size=2, timeout_s=120, group_name=GROUP), 0
    )
    for mode, version in versions:
        state = perturbed_state(model_path, seed=version)
        report = WeightSender(group, WeightSyncSettings(mode=mode, bucket_mb=1)).send(
            iter(state.items()), version
        )
        queue.put((version, report.fingerprints, report.num_messages))


def version_check_worker(rank: int, port: int, queue: Any) -> None:
    """Rank 0 sends version 3; rank 1 expects version 2 and reports what it saw before the error."""
    torch.set_num_threads(1)
    group = WeightSyncGroup(GroupSpec(host="127.0.0.1", port=port, world_size=2, timeout_s=60), rank)
    if rank == 0:
        try:
            WeightSender(group, WeightSyncSettings()).send(iter(example_tensors(3)), 3)
        except Exception:  # noqa: BLE001 - the receiver leaves after the header: the rest fails
            pass
        return
    seen = []
    try:
        for name, _ in WeightReceiver(group).receive(expect_version=2):
            seen.append(name)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        queue.put((type(exc).__name__, str(exc), seen))
        return
    queue.put(("no error", "", seen))
