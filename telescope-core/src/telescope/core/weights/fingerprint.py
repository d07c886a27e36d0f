"""Per-tensor fingerprints: 64-bit xxh3 of the tensor's bytes, plus its dtype and shape.

Bit-exact: any changed element changes the fingerprint (with probability 1 - 2^-64), so
"the inference weights are exactly the trainer's weights" is checked, not assumed. CUDA
tensors are hashed after a copy to CPU (cheap next to the transfer; xxh3 hashes ~20 GB/s).
On the wire a fingerprint is just its 64-bit digest (the receiver knows dtype and shape).
"""

from __future__ import annotations

import torch
import xxhash

from telescope.core.weights.verify import compare_fingerprints

__all__ = ["compare_fingerprints", "digest", "fingerprint", "format_fingerprint"]


def digest(tensor: torch.Tensor) -> int:
    """xxh3-64 of ``tensor``'s values in row-major order (layout independent), as a signed int64."""
    flat = tensor.detach().reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.cpu()
    flat = flat.contiguous()
    raw = flat.view(torch.uint8) if flat.numel() else flat.new_empty(0, dtype=torch.uint8)
    value = xxhash.xxh3_64_intdigest(memoryview(raw.numpy()))  # type: ignore[arg-type]
    return value - (1 << 64) if value >= 1 << 63 else value  # fits an int64 tensor


def format_fingerprint(dtype: torch.dtype | str, shape: tuple[int, ...] | torch.Size, value: int) -> str:
    """``"<dtype>:<shape>:<xxh3 hex>"`` from a ``digest``."""
    name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    return f"{name}:{'x'.join(str(d) for d in shape)}:{value & ((1 << 64) - 1):016x}"


def fingerprint(tensor: torch.Tensor) -> str:
    """``"<dtype>:<shape>:<xxh3 hex>"`` of ``tensor``'s values (layout independent)."""
    return format_fingerprint(tensor.dtype, tuple(tensor.shape), digest(tensor))
