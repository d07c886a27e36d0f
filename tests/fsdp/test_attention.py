"""packed_sdpa: grouped causal attention over packed rows, equal to per-sample SDPA and to a dense
block-diagonal masked softmax (a second implementation written out here)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from telescope.fsdp.attention import (  # noqa: E402
    GROUP_MAX_LEN,
    grouped_attention,
    packed_sdpa_attention,
    per_sample_attention,
    plan_attention,
    plan_groups,
    register_packed_sdpa,
    segment_contexts,
    segment_lengths,
)


def test_segment_lengths() -> None:
    pos = torch.tensor([0, 1, 2, 0, 1, 0, 0, 1, 2, 3])
    assert segment_lengths(pos) == [3, 2, 1, 4]
    assert segment_lengths(torch.arange(5)) == [5]


def block_mask_attention(q: Any, k: Any, v: Any, lengths: list[int], scale: float) -> Any:
    """Second implementation: explicit softmax under a block-diagonal causal mask -> [1, L, H, D]."""
    L, H, Hkv = q.shape[2], q.shape[1], k.shape[1]
    seg = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    allowed = (seg[:, None] == seg[None, :]) & (torch.arange(L)[:, None] >= torch.arange(L)[None, :])
    kk, vv = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
    scores = (q @ kk.transpose(-1, -2)) * scale
    return (torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ vv).transpose(1, 2)


def random_qkv(lengths: list[int], H: int = 4, Hkv: int = 2, D: int = 8) -> tuple[Any, Any, Any, Any]:
    torch.manual_seed(0)
    L = sum(lengths)
    q, k, v = (torch.randn(1, h, L, D, requires_grad=True) for h in (H, Hkv, Hkv))
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    return q, k, v, pos


def test_packed_sdpa_equals_dense_block_mask_attention() -> None:
    lengths = [5, 1, 7, 3]
    q, k, v, pos = random_qkv(lengths)
    out, _ = packed_sdpa_attention(torch.nn.Module(), q, k, v, None, scaling=8**-0.5, position_ids=pos)
    expected = block_mask_attention(q, k, v, lengths, 8**-0.5)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_packed_sdpa_gradients_equal_dense_block_mask_attention() -> None:
    lengths = [6, 2, 9, 1, 4]
    q, k, v, pos = random_qkv(lengths)
    upstream = torch.randn(1, sum(lengths), 4, 8)
    out, _ = packed_sdpa_attention(torch.nn.Module(), q, k, v, None, scaling=8**-0.5, position_ids=pos)
    got = torch.autograd.grad((out * upstream).sum(), (q, k, v))
    expected_out = block_mask_attention(q, k, v, lengths, 8**-0.5)
    expected = torch.autograd.grad((expected_out * upstream).sum(), (q, k, v))
    for name, g, e in zip("qkv", got, expected, strict=True):
        assert g.abs().max() > 1e-3, name  # a real gradient flows to every input
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5, msg=f"d loss / d {name}")


def assert_row_matches_one_sequence_at_a_time(model_dir: str, samples: list[Any], row: Any) -> None:
    """A packed row through a model using packed_sdpa: each sample's trained completion logprobs
    equal those of plain transformers sdpa run on that sample alone (1e-5), and so do the parameter
    gradients of an advantage-weighted loss over them (an independent, unpacked computation)."""
    from transformers import AutoModelForCausalLM

    from telescope.core.algorithms.logprobs import token_logprobs
    from telescope.core.training.tensors import to_device
    from telescope.fsdp.microbatch import packed_logits

    def load(attn: str) -> Any:
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=attn)

    packed_model, ref_model = load(register_packed_sdpa()), load("sdpa")
    mb = to_device(row, torch.device("cpu"))
    packed = token_logprobs(packed_logits(packed_model, mb), mb.targets)
    weights = torch.tensor([s.advantage for s in samples])
    ref_loss = torch.zeros(())
    sample_of_target = torch.tensor(row.sample_index[1:])
    for i, s in enumerate(samples):
        ids = torch.tensor([list(s.prompt_ids) + list(s.completion_ids)])
        logits = ref_model(input_ids=ids, use_cache=False).logits[0, :-1]
        ref = token_logprobs(logits, ids[0, 1:])[len(s.prompt_ids) - 1 :]
        trained = torch.tensor(s.effective_loss_mask()) > 0
        mask = (sample_of_target == i) & (mb.loss_mask > 0)
        torch.testing.assert_close(packed[mask], ref[trained].detach(), atol=1e-5, rtol=0)
        ref_loss = ref_loss + weights[i] * ref[trained].sum()
    sample_weight = torch.where(sample_of_target >= 0, weights[sample_of_target.clamp(min=0)], 0.0)
    (packed * mb.loss_mask * sample_weight).sum().backward()
    ref_loss.backward()
    ref_grads = dict(ref_model.named_parameters())
    for name, param in packed_model.named_parameters():
        torch.testing.assert_close(param.grad, ref_grads[name].grad, atol=1e-5, rtol=1e-4, msg=name)


def test_packed_sdpa_model_logprobs_and_grads_equal_per_sequence(tiny_model_dir: str) -> None:
    """A packed row through a model using packed_sdpa: completion logprobs equal one-sequence-at-a-
    time sdpa logprobs (1e-5), and so do the parameter gradients of a loss over them."""
    from fsdp_helpers import make_samples

    from telescope.core.packing import Packer

    samples = make_samples(6, seed=5)
    (row,) = Packer(seq_len=256, pad_to_multiple_of=8).pack(samples).per_rank[0]
    assert len(segment_lengths(torch.tensor(row.position_ids))) == 7  # 6 samples + the padding segment
    assert_row_matches_one_sequence_at_a_time(tiny_model_dir, samples, row)


def grouped_samples(seed: int) -> list[Any]:
    """GRPO-like samples: 3 prompts x 3 completions (two prompts share a 6-token system part),
    one prompt alone, and a multi-turn sample with untrained environment tokens; shuffled."""
    import random

    from telescope.core.packing import TrainSample

    rng = random.Random(seed)
    system = [rng.randrange(1, 60) for _ in range(6)]
    prompts = [system + [rng.randrange(1, 60) for _ in range(n)] for n in (3, 5)] + [[7, 8, 9, 10]]
    samples = []
    for prompt in prompts:
        for _ in range(3):
            c = rng.randint(1, 12)
            samples.append(
                TrainSample(
                    prompt, [rng.randrange(1, 60) for _ in range(c)], [-1.0] * c, rng.uniform(-1.5, 1.5)
                )
            )
    samples.append(TrainSample([3, 4], [5, 6], [-1.0] * 2, 0.7))
    samples.append(TrainSample(prompts[0], [11, 12, 13, 14, 15], [-1.0] * 5, -0.4, [1, 0, 0, 1, 1]))
    rng.shuffle(samples)
    return samples


def test_shared_prefix_rows_give_the_logprobs_and_grads_of_one_sequence_at_a_time(
    tiny_model_dir: str,
) -> None:
    """share_prefixes writes each shared prompt once; packed_sdpa reads the row back: completion
    logprobs equal one-sequence-at-a-time sdpa logprobs, and so do the gradients (an independent
    computation: plain transformers sdpa, one unpacked sequence per call)."""
    from telescope.core.packing import Packer, share_prefixes

    samples = grouped_samples(3)
    (full,) = Packer(seq_len=512, pad_to_multiple_of=8).pack(samples).per_rank[0]
    row = share_prefixes(full, pad_to_multiple_of=8)
    # 6 of 9 grouped prompts are dropped but their last token; 2 of 3 for the shared system part
    assert row.num_real_tokens < full.num_real_tokens - 40
    assert row.num_loss_tokens == full.num_loss_tokens and row.num_samples == full.num_samples
    assert_row_matches_one_sequence_at_a_time(tiny_model_dir, samples, row)


def test_segment_contexts_walk_back_over_the_positions_before_a_segment() -> None:
    # a: 0..5 | b continues a from 3 | c continues b from 4 (3 from a, 1 from b) | d from 2 | pad
    pos = torch.tensor([0, 1, 2, 3, 4, 5, 3, 4, 5, 4, 5, 2, 3, 0, 1])
    lengths, contexts = segment_contexts(pos)
    assert lengths == [6, 3, 2, 2, 2]
    assert contexts == [[], [(0, 3)], [(0, 3), (6, 1)], [(0, 2)], []]
    # a gap (nothing holds positions 1..4) or nothing before: no context, as before sharing
    assert segment_contexts(torch.tensor([0, 5, 6, 1, 2]))[1] == [[], [], [(0, 1)]]
    assert segment_contexts(torch.tensor([2, 3, 0]))[1] == [[], []]


def test_plan_groups_batches_short_samples_by_length_class_and_keeps_long_ones_alone() -> None:
    lengths = [1, 300, 2, 3, 4, 5, 8, 9, 16, 17, 256, 257]
    groups = plan_groups(lengths, group_max_len=256)
    assert groups == [[1], [11], [0], [2], [3, 4], [5, 6], [7, 8], [9], [10]]
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for g in groups:  # a batched call pads each sample to at most twice its length
        assert max(lengths[i] for i in g) <= 2 * min(lengths[i] for i in g) or len(g) == 1


LENGTH_MIXES = {
    "short_with_length_1": [1, 5, 3, 7, 2, 1, 6, 4],
    "rl_mix": [12, 40, 33, 1, 64, 17, 9, 31, 2, 50],
    "long_and_short": [GROUP_MAX_LEN + 37, 3, GROUP_MAX_LEN, 1, 90],
    "full_row_one_sample": [320],
}


@pytest.mark.parametrize("mix", sorted(LENGTH_MIXES))
def test_grouped_attention_outputs_and_gradients_equal_per_sample_path(mix: str) -> None:
    lengths = LENGTH_MIXES[mix]
    q, k, v, _ = random_qkv(lengths, H=4, Hkv=2, D=16)
    upstream = torch.randn(1, sum(lengths), 4, 16)
    scale = 16**-0.5
    plan = plan_attention(lengths, torch.device("cpu"))
    got_out = grouped_attention(q, k, v, plan, 0.0, scale)
    got = torch.autograd.grad((got_out * upstream).sum(), (q, k, v))
    ref_out = per_sample_attention(q, k, v, lengths, 0.0, scale)
    ref = torch.autograd.grad((ref_out * upstream).sum(), (q, k, v))
    torch.testing.assert_close(got_out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_out, block_mask_attention(q, k, v, lengths, scale), atol=1e-5, rtol=1e-5)
    for name, g, e in zip("qkv", got, ref, strict=True):
        assert g.abs().max() > 1e-3, name
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5, msg=f"d loss / d {name}")


def test_packed_sdpa_rejects_padded_batches_and_registers() -> None:
    q = torch.randn(2, 2, 4, 8)
    with pytest.raises(ValueError, match="one packed row"):
        packed_sdpa_attention(torch.nn.Module(), q, q, q, None, position_ids=torch.arange(4)[None])
    from transformers import AttentionInterface

    name = register_packed_sdpa()
    assert AttentionInterface._global_mapping[name] is packed_sdpa_attention


def test_flash_varlen_kwargs_equal_transformers_own_derivation_from_position_ids() -> None:
    from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids

    from telescope.fsdp.attention import flash_varlen_kwargs

    pos = torch.cat([torch.arange(n) for n in (5, 1, 7, 3, 4)])[None]  # the last one: a padding segment
    (cu_q, cu_k), (max_q, max_k) = prepare_fa_kwargs_from_position_ids(pos)
    got = flash_varlen_kwargs(pos)
    assert got["cu_seq_lens_q"].tolist() == cu_q.tolist() == [0, 5, 6, 13, 16, 20]
    assert got["cu_seq_lens_k"].tolist() == cu_k.tolist() and got["cu_seq_lens_q"].dtype == cu_q.dtype
    assert got["max_length_q"] == int(max_q) == got["max_length_k"] == int(max_k) == 7


def test_flash_implementations_are_recognised() -> None:
    from types import SimpleNamespace

    from telescope.fsdp.attention import uses_flash_attention

    def model(impl: str | None) -> Any:
        return SimpleNamespace(config=SimpleNamespace(_attn_implementation=impl))

    assert uses_flash_attention(model("flash_attention_2")) and uses_flash_attention(
        model("flash_attention_3")
    )
    assert uses_flash_attention(model("kernels-community/flash-attn2"))
    assert not any(uses_flash_attention(model(i)) for i in ("sdpa", "eager", register_packed_sdpa(), None))


def test_packed_logits_give_every_flash_layer_the_boundaries_computed_once(
    tiny_model_dir: str, monkeypatch: Any
) -> None:
    """flash-attn cannot run on CPU: a recording attention function stands in for it (and computes
    packed_sdpa), so the kwargs transformers hands each layer can be checked."""
    from fsdp_helpers import make_samples
    from transformers import AttentionInterface, AutoModelForCausalLM

    from telescope.core.packing import Packer
    from telescope.core.training.tensors import to_device
    from telescope.fsdp import microbatch
    from telescope.fsdp.microbatch import packed_logits

    monkeypatch.setattr(
        microbatch,
        "uses_flash_attention",
        lambda m: m.config._attn_implementation == "telescope_test_recorder",
    )

    seen: list[dict[str, Any]] = []

    def recording_flash(module: Any, q: Any, k: Any, v: Any, mask: Any, **kwargs: Any) -> Any:
        seen.append({n: kwargs.get(n) for n in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q")})
        return packed_sdpa_attention(module, q, k, v, mask, **kwargs)

    AttentionInterface.register("telescope_test_recorder", recording_flash)
    model = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation="telescope_test_recorder"
    )
    reference = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation=register_packed_sdpa()
    )
    (row,) = Packer(seq_len=128, pad_to_multiple_of=8).pack(make_samples(4, seed=2)).per_rank[0]
    mb = to_device(row, torch.device("cpu"))
    logits = packed_logits(model, mb)
    lengths = segment_lengths(mb.position_ids[0])
    expected_cu = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    assert len(seen) == model.config.num_hidden_layers >= 2
    assert all(s["cu_seq_lens_q"] is seen[0]["cu_seq_lens_q"] for s in seen)  # one tensor for all layers
    assert seen[0]["cu_seq_lens_q"].tolist() == expected_cu and seen[0]["max_length_q"] == max(lengths)
    torch.testing.assert_close(logits, packed_logits(reference, mb), atol=1e-6, rtol=0)
    seen.clear()
    packed_logits(reference, mb)  # not a flash implementation: no varlen kwargs
    assert not seen


def test_a_flash_attn_that_is_found_but_does_not_import_is_reported(tmp_path: Any, monkeypatch: Any) -> None:
    import sys

    from telescope.fsdp.attention import flash_attn_problem

    if "flash_attn" not in sys.modules:
        assert "not installed" in str(flash_attn_problem())
    broken = tmp_path / "flash_attn"
    broken.mkdir()
    (broken / "__init__.py").write_text(
        "raise ImportError('flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDeviceEi')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    problem = flash_attn_problem()
    assert problem is not None and "installed but does not import" in problem
    assert "undefined symbol" in problem and torch.__version__ in problem


def test_a_flash_attn_that_does_not_import_falls_back_or_is_refused(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Found is not usable: a wheel built for another torch crashed the first forward pass."""
    from telescope.fsdp import model

    broken = "flash-attn is installed but does not import (ImportError: undefined symbol)"
    monkeypatch.setattr(model, "flash_attn_problem", lambda: broken)
    monkeypatch.setattr(model, "_flash_attn_found", lambda: True)
    cuda = torch.device("cuda", 0)
    with caplog.at_level("WARNING"):
        assert model.pick_attn_implementation("auto", cuda) == "telescope_packed_sdpa"
    assert "using packed_sdpa, not flash-attn: flash-attn is installed but does not import" in caplog.text
    with pytest.raises(ValueError, match="'flash_attention_2': flash-attn is installed but does not import"):
        model.pick_attn_implementation("flash_attention_2", cuda)
    monkeypatch.setattr(model, "flash_attn_problem", lambda: None)
    assert model.pick_attn_implementation("auto", cuda) == "flash_attention_2"
    assert (
        model.pick_attn_implementation("auto", cuda, torch.float32) == "telescope_packed_sdpa"
    )  # 16 bits only
