"""packed_sdpa: per-sample causal attention over packed rows, equal to transformers' masked sdpa."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from telescope.fsdp.attention import packed_sdpa_attention, register_packed_sdpa, segment_lengths  # noqa: E402


def test_segment_lengths() -> None:
    pos = torch.tensor([0, 1, 2, 0, 1, 0, 0, 1, 2, 3])
    assert segment_lengths(pos) == [3, 2, 1, 4]
    assert segment_lengths(torch.arange(5)) == [5]


def test_packed_sdpa_equals_dense_block_mask_attention() -> None:
    torch.manual_seed(0)
    lengths = [5, 1, 7, 3]
    L, H, Hkv, D = sum(lengths), 4, 2, 8
    q, k, v = torch.randn(1, H, L, D), torch.randn(1, Hkv, L, D), torch.randn(1, Hkv, L, D)
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    module = torch.nn.Module()
    out, _ = packed_sdpa_attention(module, q, k, v, None, scaling=D**-0.5, position_ids=pos)
    # second implementation: explicit softmax with a block-diagonal causal mask
    seg = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    allowed = (seg[:, None] == seg[None, :]) & (torch.arange(L)[:, None] >= torch.arange(L)[None, :])
    kk, vv = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
    scores = (q @ kk.transpose(-1, -2)) * D**-0.5
    expected = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ vv
    torch.testing.assert_close(out, expected.transpose(1, 2), atol=1e-5, rtol=1e-5)


def test_packed_sdpa_rejects_padded_batches_and_registers() -> None:
    q = torch.randn(2, 2, 4, 8)
    with pytest.raises(ValueError, match="one packed row"):
        packed_sdpa_attention(torch.nn.Module(), q, q, q, None, position_ids=torch.arange(4)[None])
    from transformers import AttentionInterface

    name = register_packed_sdpa()
    assert AttentionInterface._global_mapping[name] is packed_sdpa_attention
