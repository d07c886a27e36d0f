"""Per-tensor fingerprints: a 64-bit digest of the tensor's bytes, plus its dtype and shape.

Two digests, one per kind of weight-sync group (both sides of a group use the same one):

- ``xxh3`` (gloo groups, CPU tensors): xxh3-64 of the bytes on the CPU (~20 GB/s).
- ``sum64`` (NCCL groups, CUDA tensors): a checksum computed **on the device** with integer torch
  ops, so verifying a sync never copies the weights to the host (on a vLLM worker that copy and a
  host hash of every tensor ran while generation was paused). Each word ``w_i`` of the bytes adds
  ``(w_i xor a_i) * b_i`` modulo 2^64 with odd ``b_i``: any single changed word changes the sum, and
  the result is the same on every device (integer arithmetic, order independent). It is a transport
  checksum, not a cryptographic hash.

Either way "the inference weights are exactly the trainer's weights" is checked, not assumed. On the
wire a fingerprint is just its 64-bit digest (the receiver knows dtype and shape); as a string it is
``dtype:shape:hex`` (xxh3) or ``dtype:shape:sum64-hex``.
"""

from __future__ import annotations

import torch
import xxhash

from telescope.core.weights.verify import compare_fingerprints

__all__ = [
    "DIGESTS",
    "algorithm_of",
    "compare_fingerprints",
    "digest",
    "digest_for_device",
    "fingerprint",
    "format_fingerprint",
    "sum64_digest",
    "sum64_tensor",
]

DIGESTS = ("xxh3", "sum64")

#: Words per step of ``sum64_digest``: bounds its int64 temporaries (3 x 32 MiB).
SUM64_CHUNK = 1 << 22
_A = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed int64 (golden-ratio increment)
_B = -4658895280553007687  # 0xBF58476D1CE4E5B9 as a signed int64 (splitmix64 multiplier)


def digest_for_device(device: torch.device) -> str:
    """The digest a weight-sync group on ``device`` uses: ``sum64`` on CUDA, ``xxh3`` elsewhere."""
    return "sum64" if device.type == "cuda" else "xxh3"


def algorithm_of(fingerprint_text: str) -> str:
    """Which digest made a fingerprint string."""
    return "sum64" if fingerprint_text.rsplit(":", 1)[-1].startswith("sum64-") else "xxh3"


def digest(tensor: torch.Tensor, algorithm: str = "xxh3") -> int:
    """``algorithm``'s digest of ``tensor``'s values in row-major order, as a signed int64."""
    if algorithm == "sum64":
        return sum64_digest(tensor)
    if algorithm != "xxh3":
        raise ValueError(f"digest algorithm {algorithm!r}: use one of {', '.join(DIGESTS)}")
    return _xxh3_digest(tensor)


def _words(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes in row-major order as int32, int16 or uint8 words (chosen by the byte count
    only, so both ends of a sync agree whatever their tensors' storage offsets)."""
    raw = tensor.detach().reshape(-1).contiguous()
    raw = raw.view(torch.uint8) if raw.numel() else raw.new_empty(0, dtype=torch.uint8)
    word = torch.int32 if raw.numel() % 4 == 0 else torch.int16 if raw.numel() % 2 == 0 else torch.uint8
    try:
        return raw.view(word)
    except RuntimeError:  # a storage offset not aligned to the word size: an aligned copy
        return raw.clone().view(word)


def sum64_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """``sum_i (w_i xor (i * A)) * ((i * B) | 1)`` mod 2^64 over the words ``w_i`` of ``tensor``'s bytes,
    as a 0-dim int64 tensor where the tensor is (queued: no device sync; see the module docstring)."""
    words = _words(tensor)
    total = torch.zeros((), dtype=torch.int64, device=words.device)
    for start in range(0, words.numel(), SUM64_CHUNK):
        chunk = words[start : start + SUM64_CHUNK].to(torch.int64)
        index = torch.arange(start, start + chunk.numel(), dtype=torch.int64, device=words.device)
        total += ((chunk ^ (index * _A)) * ((index * _B) | 1)).sum()
    return total


def sum64_digest(tensor: torch.Tensor) -> int:
    """``sum64_tensor`` as an int (one device sync)."""
    return int(sum64_tensor(tensor).item())


def _xxh3_digest(tensor: torch.Tensor) -> int:
    flat = tensor.detach().reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.cpu()
    flat = flat.contiguous()
    raw = flat.view(torch.uint8) if flat.numel() else flat.new_empty(0, dtype=torch.uint8)
    value = xxhash.xxh3_64_intdigest(memoryview(raw.numpy()))  # type: ignore[arg-type]
    return value - (1 << 64) if value >= 1 << 63 else value  # fits an int64 tensor


def format_fingerprint(
    dtype: torch.dtype | str, shape: tuple[int, ...] | torch.Size, value: int, algorithm: str = "xxh3"
) -> str:
    """``"<dtype>:<shape>:<hex>"`` from a ``digest`` (``sum64-<hex>`` for the device checksum)."""
    name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    prefix = "sum64-" if algorithm == "sum64" else ""
    return f"{name}:{'x'.join(str(d) for d in shape)}:{prefix}{value & ((1 << 64) - 1):016x}"


def fingerprint(tensor: torch.Tensor, algorithm: str = "xxh3") -> str:
    """``"<dtype>:<shape>:<hex>"`` of ``tensor``'s values (layout independent)."""
    return format_fingerprint(tensor.dtype, tuple(tensor.shape), digest(tensor, algorithm), algorithm)
