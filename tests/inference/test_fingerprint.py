"""The two weight-sync digests: xxh3 on the host (gloo groups) and sum64 computed where the tensor is
(NCCL groups: verifying a sync never copies the weights to the host). sum64 is checked against a
second implementation written out here in Python integers; it runs on CPU exactly as on a GPU
(integer arithmetic), which is what lets CPU CI check it."""

from __future__ import annotations

import pytest
import torch

from telescope.core.weights import fingerprint as fp
from telescope.core.weights.load import ModelWeightLoader

MASK = (1 << 64) - 1
A, B = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9


def reference_sum64(tensor: torch.Tensor) -> int:
    """sum_i (w_i xor (i*A)) * ((i*B) | 1) mod 2^64 over the bytes as little-endian signed words."""
    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8).tolist()
    size = 4 if len(raw) % 4 == 0 else 2 if len(raw) % 2 == 0 else 1
    total = 0
    for i in range(len(raw) // size):
        word = int.from_bytes(bytes(raw[i * size : (i + 1) * size]), "little", signed=size > 1)
        total += ((word ^ (i * A)) & MASK) * (((i * B) & MASK) | 1)
    total &= MASK
    return total - (1 << 64) if total >= 1 << 63 else total


@pytest.mark.parametrize(
    "tensor",
    [
        torch.randn(3, 5, generator=torch.Generator().manual_seed(0)),  # float32: int32 words
        torch.randn(7, generator=torch.Generator().manual_seed(1)).bfloat16(),  # 14 bytes: int16 words
        torch.tensor([1, 200, 3], dtype=torch.uint8),  # 3 bytes: byte words
        torch.arange(-4, 4, dtype=torch.int64),  # negative words
        torch.zeros(0),
    ],
)
def test_sum64_equals_its_definition(tensor: torch.Tensor) -> None:
    assert fp.sum64_digest(tensor) == reference_sum64(tensor)


def test_sum64_is_the_same_in_chunks_and_at_any_storage_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    data = torch.randn(1000, generator=torch.Generator().manual_seed(2))
    whole = fp.sum64_digest(data)
    monkeypatch.setattr(fp, "SUM64_CHUNK", 7)
    assert fp.sum64_digest(data) == whole
    buffer = torch.zeros(4001, dtype=torch.uint8)
    buffer[1:].copy_(data.view(torch.uint8))
    assert fp.sum64_digest(buffer[1:].view(torch.uint8)) == fp.sum64_digest(data.view(torch.uint8)) == whole
    assert fp.sum64_digest(data.reshape(20, 50).t().contiguous().t()) == whole  # layout independent


def test_every_single_word_change_changes_sum64() -> None:
    data = torch.randn(64, generator=torch.Generator().manual_seed(3))
    base = fp.sum64_digest(data)
    words = data.view(torch.int32)
    for i in range(0, 64, 5):
        for bit in (0, 13, 31):
            changed = words.clone()
            changed[i] ^= 1 << bit if bit < 31 else -(1 << 31)
            assert fp.sum64_digest(changed.view(torch.float32)) != base, (i, bit)
    swapped = data.clone()
    swapped[[3, 40]] = swapped[[40, 3]]
    assert fp.sum64_digest(swapped) != base


def test_a_group_on_cuda_digests_on_the_device_and_fingerprints_say_which() -> None:
    assert fp.digest_for_device(torch.device("cuda", 0)) == "sum64"
    assert fp.digest_for_device(torch.device("cpu")) == "xxh3"
    t = torch.ones(2, 3)
    assert fp.fingerprint(t, "sum64") == f"float32:2x3:sum64-{fp.sum64_digest(t) & MASK:016x}"
    assert (
        fp.algorithm_of(fp.fingerprint(t, "sum64")) == "sum64"
        and fp.algorithm_of(fp.fingerprint(t)) == "xxh3"
    )
    with pytest.raises(ValueError, match="digest algorithm 'md5': use one of xxh3, sum64"):
        fp.digest(t, "md5")


def test_loaded_weights_are_checked_with_the_digest_the_receiver_used() -> None:
    model = torch.nn.Linear(3, 2)
    loader = ModelWeightLoader(model)
    named = {"weight": torch.randn(2, 3), "bias": torch.randn(2)}
    received = {n: fp.fingerprint(t, "sum64") for n, t in named.items()}
    loader.apply(named)
    actual = loader.verify(named, where="test", received=received)
    assert actual == received  # fingerprints of what the model holds, in the receiver's digest
    from telescope.core.weights import WeightSyncMismatchError

    with torch.no_grad():
        model.bias[0] += 1
    with pytest.raises(WeightSyncMismatchError):
        loader.verify(named, where="test", received=received)


def test_a_sync_verified_with_sum64_end_to_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """The NCCL groups' path (sum64 on both sides, the receiver reading its digests back once), run
    over a gloo group in one process (two threads), with the device choice forced to sum64."""
    import threading

    from telescope.core.weights import GroupSpec, WeightSyncSettings, receiver, sender
    from telescope.core.weights.group import WeightSyncGroup, free_port
    from telescope.core.weights.verify import check_sync

    monkeypatch.setattr(sender, "digest_for_device", lambda device: "sum64")
    monkeypatch.setattr(receiver, "digest_for_device", lambda device: "sum64")
    spec = GroupSpec(host="127.0.0.1", port=free_port(), world_size=2, timeout_s=60)
    gen = torch.Generator().manual_seed(4)
    named = [
        ("a", torch.randn(5, 7, generator=gen)),
        ("b", torch.randn(3, generator=gen).bfloat16()),
        ("c", torch.randn(300, 200, generator=gen)),
    ]
    groups: dict[int, WeightSyncGroup] = {}
    threads = [
        threading.Thread(target=lambda r=r: groups.__setitem__(r, WeightSyncGroup(spec, r))) for r in (0, 1)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got: dict[str, torch.Tensor] = {}
    recv = receiver.WeightReceiver(groups[1], verify=True)
    thread = threading.Thread(target=lambda: got.update({n: t.clone() for n, t in recv.receive()}))
    thread.start()
    report = sender.WeightSender(groups[0], WeightSyncSettings(bucket_mb=1)).send(iter(named), 1)
    thread.join()
    assert recv.last_sync is not None and report.fingerprints is not None
    assert report.fingerprints == {n: fp.fingerprint(t, "sum64") for n, t in named}
    check_sync(report.fingerprints, {"server": recv.last_sync.received_fingerprints}, 1)
    assert all(torch.equal(got[n], t) for n, t in named)
