"""Per-tensor fingerprints: 64-bit xxh3 of the tensor's bytes, plus its dtype and shape.

Bit-exact: any changed element changes the fingerprint (with probability 1 - 2^-64), so
"the inference weights are exactly the trainer's weights" is checked, not assumed. CUDA
tensors are hashed after a copy to CPU (cheap next to the transfer; ~13 GB/s hashing).
"""

from __future__ import annotations

import torch
import xxhash

from telescope.core.weights.verify import compare_fingerprints

__all__ = ["compare_fingerprints", "fingerprint"]


def fingerprint(tensor: torch.Tensor) -> str:
    """``"<dtype>:<shape>:<xxh3 hex>"`` of ``tensor``'s values (layout independent)."""
    flat = tensor.detach().reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.cpu()
    flat = flat.contiguous()
    raw = flat.view(torch.uint8) if flat.numel() else flat.new_empty(0, dtype=torch.uint8)
    digest = xxhash.xxh3_64_hexdigest(memoryview(raw.numpy()))  # type: ignore[arg-type]
    shape = "x".join(str(d) for d in tensor.shape)
    return f"{str(tensor.dtype).removeprefix('torch.')}:{shape}:{digest}"
