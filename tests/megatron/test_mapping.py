"""HF <-> Megatron weight mapping: exact round trips and layout checks against Megatron's math."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from megatron_helpers import MODEL_KINDS

from telescope.megatron.mapping import (
    MegatronToHFStream,
    hf_to_megatron,
    megatron_to_hf,
    model_spec_from_hf_config,
    shard_state_dict,
    unshard_state_dicts,
)
from telescope.megatron.mapping.fuse import split_qkv
from telescope.megatron.mapping.tp import expert_index, rename_expert, tp_partition


def _hf_state(model) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("te_spec", [False, True])
@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_round_trip_exact(tiny_models, kind: str, te_spec: bool) -> None:
    model = tiny_models(kind)
    spec = model_spec_from_hf_config(model.config)
    hf = _hf_state(model)
    padded = spec.padded_vocab_size(128, 2)
    meg = hf_to_megatron(hf, spec, te_spec=te_spec, padded_vocab=padded)
    assert meg["embedding.word_embeddings.weight"].shape == (256, 32)
    assert torch.count_nonzero(meg["embedding.word_embeddings.weight"][100:]) == 0
    assert ("output_layer.weight" in meg) == (not spec.tie_word_embeddings)
    back = megatron_to_hf(meg, spec, te_spec=te_spec)
    expected = {k for k in hf if not (spec.tie_word_embeddings and k == "lm_head.weight")}
    assert set(back) == expected
    for name in expected:
        assert torch.equal(back[name], hf[name]), name


def test_megatron_names_local_and_te(tiny_models) -> None:
    spec = model_spec_from_hf_config(tiny_models("qwen3_moe").config)
    hf = _hf_state(tiny_models("qwen3_moe"))
    local = hf_to_megatron(hf, spec, te_spec=False)
    te = hf_to_megatron(hf, spec, te_spec=True)
    assert "decoder.layers.0.input_layernorm.weight" in local
    assert "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight" in te
    assert "decoder.layers.1.mlp.linear_fc1.layer_norm_weight" in te  # dense layer: fused norm
    assert "decoder.layers.0.pre_mlp_layernorm.weight" in te  # MoE layer: separate norm
    assert "decoder.layers.2.mlp.experts.local_experts.3.linear_fc2.weight" in local
    assert "decoder.layers.2.mlp.experts.linear_fc2.weight3" in te
    assert torch.equal(local["decoder.layers.0.mlp.router.weight"], hf["model.layers.0.mlp.gate.weight"])
    assert torch.equal(
        local["decoder.layers.0.mlp.experts.local_experts.2.linear_fc1.weight"],
        hf["model.layers.0.mlp.experts.gate_up_proj"][2],
    )
    assert torch.equal(
        local["decoder.layers.0.self_attention.q_layernorm.weight"],
        hf["model.layers.0.self_attn.q_norm.weight"],
    )


def _megatron_qkv_heads(qkv_weight, qkv_bias, x, groups_here: int, spec):  # type: ignore[no-untyped-def]
    """Megatron SelfAttention.get_query_key_value_tensors: view as [groups, (hpg+2)*d], split."""
    mixed = x @ qkv_weight.T + (qkv_bias if qkv_bias is not None else 0)
    d, hpg = spec.head_dim, spec.heads_per_group
    mixed = mixed.view(x.shape[0], groups_here, (hpg + 2) * d)
    q, k, v = torch.split(mixed, [hpg * d, d, d], dim=-1)
    return q.reshape(x.shape[0], -1), k.reshape(x.shape[0], -1), v.reshape(x.shape[0], -1)


@pytest.mark.parametrize("kind,tp", [("qwen2", 1), ("qwen2", 2), ("qwen3", 2), ("llama", 1)])
def test_fused_qkv_matches_hf_projections_per_tp_rank(tiny_models, kind: str, tp: int) -> None:
    model = tiny_models(kind)
    spec = model_spec_from_hf_config(model.config)
    meg = hf_to_megatron(_hf_state(model), spec)
    x = torch.randn(5, spec.hidden_size)
    attn = model.model.layers[1].self_attn
    qs, ks, vs = [], [], []
    for r in range(tp):
        shard = shard_state_dict(meg, tp, r)
        w = shard["decoder.layers.1.self_attention.linear_qkv.weight"]
        b = shard.get("decoder.layers.1.self_attention.linear_qkv.bias")
        q, k, v = _megatron_qkv_heads(w, b, x, spec.num_key_value_heads // tp, spec)
        qs.append(q), ks.append(k), vs.append(v)
    with torch.no_grad():
        torch.testing.assert_close(torch.cat(qs, -1), attn.q_proj(x), rtol=0, atol=1e-6)
        torch.testing.assert_close(torch.cat(ks, -1), attn.k_proj(x), rtol=0, atol=1e-6)
        torch.testing.assert_close(torch.cat(vs, -1), attn.v_proj(x), rtol=0, atol=1e-6)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_gated_mlp_tp_shards_sum_to_hf_mlp(tiny_models, tp: int) -> None:
    """Megatron's MLP per TP rank: fc1 shard -> chunk(2) -> silu(gate)*up -> fc2 row shard; the
    row-parallel outputs are summed (all-reduce). The sum must equal HF's MLP."""
    model = tiny_models("qwen2")
    spec = model_spec_from_hf_config(model.config)
    meg = hf_to_megatron(_hf_state(model), spec)
    x = torch.randn(3, spec.hidden_size)
    total = torch.zeros(3, spec.hidden_size)
    for r in range(tp):
        shard = shard_state_dict(meg, tp, r)
        gate, up = (x @ shard["decoder.layers.0.mlp.linear_fc1.weight"].T).chunk(2, dim=-1)
        total += (F.silu(gate) * up) @ shard["decoder.layers.0.mlp.linear_fc2.weight"].T
    with torch.no_grad():
        torch.testing.assert_close(total, model.model.layers[0].mlp(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", MODEL_KINDS)
@pytest.mark.parametrize("tp", [2])
def test_tp_shard_unshard_round_trip(tiny_models, kind: str, tp: int) -> None:
    model = tiny_models(kind)
    spec = model_spec_from_hf_config(model.config)
    if spec.num_key_value_heads % tp:
        pytest.skip("Megatron needs num_key_value_heads divisible by TP")
    meg = hf_to_megatron(_hf_state(model), spec, padded_vocab=spec.padded_vocab_size(128, tp))
    shards = [shard_state_dict(meg, tp, r) for r in range(tp)]
    emb = "embedding.word_embeddings.weight"
    assert shards[1][emb].shape[0] == meg[emb].shape[0] // tp
    assert torch.equal(shards[1][emb], meg[emb][meg[emb].shape[0] // tp : 2 * meg[emb].shape[0] // tp])
    full = unshard_state_dicts(shards)
    assert set(full) == set(meg)
    for name in meg:
        assert torch.equal(full[name], meg[name]), name


def test_gated_column_shard_layout_by_hand() -> None:
    full = torch.arange(8.0)[:, None]  # gate rows 0..3, up rows 4..7
    assert tp_partition("decoder.layers.0.mlp.linear_fc1.weight") == "gated_column"
    assert tp_partition("decoder.layers.0.mlp.experts.linear_fc1.weight7") == "gated_column"
    assert tp_partition("decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.weight") == "row"
    assert tp_partition("decoder.layers.0.mlp.router.weight") == "replicated"
    from telescope.megatron.mapping.tp import shard_tensor

    assert shard_tensor(full, "gated_column", 2, 0).flatten().tolist() == [0, 1, 4, 5]
    assert shard_tensor(full, "gated_column", 2, 1).flatten().tolist() == [2, 3, 6, 7]


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_stream_matches_bulk_in_any_order(tiny_models, kind: str) -> None:
    model = tiny_models(kind)
    spec = model_spec_from_hf_config(model.config)
    meg = hf_to_megatron(_hf_state(model), spec, te_spec=True, padded_vocab=256)
    items = list(meg.items())
    random.Random(0).shuffle(items)
    stream = MegatronToHFStream(spec, te_spec=True)
    got = dict(stream.convert_all(iter(items)))
    bulk = megatron_to_hf(meg, spec, te_spec=True)
    assert set(got) == set(bulk)
    assert all(torch.equal(got[k], bulk[k]) for k in bulk)


def test_stream_reports_incomplete_group(tiny_models) -> None:
    spec = model_spec_from_hf_config(tiny_models("qwen3_moe").config)
    meg = hf_to_megatron(_hf_state(tiny_models("qwen3_moe")), spec)
    stream = MegatronToHFStream(spec)
    assert (
        stream.feed(
            "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight",
            meg["decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight"],
        )
        == []
    )
    with pytest.raises(RuntimeError, match="incomplete"):
        stream.finish()
    with pytest.raises(KeyError, match="no HF mapping"):
        stream.feed("decoder.layers.0.bogus.weight", torch.zeros(1))


def test_expert_renaming() -> None:
    assert expert_index("decoder.layers.3.mlp.experts.local_experts.12.linear_fc1.weight") == 12
    assert expert_index("decoder.layers.3.mlp.experts.linear_fc2.weight5") == 5
    assert expert_index("decoder.layers.3.mlp.linear_fc2.weight") is None
    assert (
        rename_expert("decoder.layers.3.mlp.experts.linear_fc2.weight5", 1)
        == "decoder.layers.3.mlp.experts.linear_fc2.weight1"
    )
    assert (
        rename_expert("decoder.layers.3.mlp.experts.local_experts.2.linear_fc1.weight", 6)
        == "decoder.layers.3.mlp.experts.local_experts.6.linear_fc1.weight"
    )


def test_errors_name_the_problem(tiny_models) -> None:
    model = tiny_models("qwen2")
    spec = model_spec_from_hf_config(model.config)
    hf = _hf_state(model)
    with pytest.raises(KeyError, match="no mapping"):
        hf_to_megatron({**hf, "model.extra.weight": torch.zeros(1)}, spec)
    del hf["model.layers.0.self_attn.k_proj.weight"]
    with pytest.raises(KeyError, match="k_proj"):
        hf_to_megatron(hf, spec)
    with pytest.raises(ValueError, match="tensor-parallel shard"):
        split_qkv(torch.zeros(8, 32), spec)
    with pytest.raises(ValueError, match="gpt2"):
        model_spec_from_hf_config({"model_type": "gpt2"})


def test_spec_reads_architecture_facts(tiny_models) -> None:
    moe = model_spec_from_hf_config(tiny_models("qwen3_moe").config)
    assert moe.moe_layers == frozenset({0, 2}) and moe.num_experts == 4 and moe.moe_top_k == 2
    assert moe.qk_norm and not moe.qkv_bias
    q2 = model_spec_from_hf_config(tiny_models("qwen2").config)
    assert q2.qkv_bias and not q2.qk_norm and q2.head_dim == 8
    q3 = model_spec_from_hf_config(tiny_models("qwen3").config)
    assert q3.head_dim == 16 and q3.heads_per_group == 2
    sparse = model_spec_from_hf_config(
        {
            "model_type": "qwen3_moe",
            "num_hidden_layers": 6,
            "hidden_size": 8,
            "num_attention_heads": 2,
            "intermediate_size": 8,
            "vocab_size": 10,
            "num_experts": 2,
            "decoder_sparse_step": 2,
        }
    )
    assert sparse.moe_layers == frozenset({1, 3, 5})
    assert q2.padded_vocab_size(128, 1) == 128 and q2.padded_vocab_size(64, 3) == 192


def test_placement_names_round_trip() -> None:
    from telescope.megatron.mapping.placement import global_name, local_name

    local = "decoder.layers.1.mlp.experts.local_experts.0.linear_fc1.weight"
    glob = global_name(local, layer_offset=4, expert_offset=8)
    assert glob == "decoder.layers.5.mlp.experts.local_experts.8.linear_fc1.weight"
    assert local_name(glob, 4, 8) == local
    assert (
        global_name("decoder.layers.0.mlp.experts.linear_fc2.weight1", 2, 2)
        == "decoder.layers.2.mlp.experts.linear_fc2.weight3"
    )
    assert global_name("embedding.word_embeddings.weight", 3, 3) == "embedding.word_embeddings.weight"
    assert (
        global_name("decoder.layers.1.self_attention.linear_qkv.weight", 0, 4)
        == "decoder.layers.1.self_attention.linear_qkv.weight"
    )
    with pytest.raises(ValueError, match="earlier pipeline stage"):
        local_name("decoder.layers.1.mlp.linear_fc1.weight", layer_offset=2)


def _saved_state(model, tmp_path) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    """What transformers writes to disk: per-expert names for MoE (the hub's layout), whatever its
    in-memory modules hold (transformers 5 fuses the experts on load and splits them on save)."""
    from safetensors.torch import load_file

    model.save_pretrained(tmp_path)
    out: dict[str, torch.Tensor] = {}
    for path in sorted(tmp_path.glob("*.safetensors")):
        out.update(load_file(path))
    return out


@pytest.mark.parametrize("te_spec", [False, True])
def test_moe_checkpoints_convert_in_both_expert_layouts(tiny_models, tmp_path, te_spec: bool) -> None:
    """vLLM 0.16/0.17 pin transformers < 5 and load per-expert names; transformers 5 holds fused experts."""
    from telescope.megatron.mapping.rules import detect_expert_layout

    model = tiny_models("qwen3_moe")
    spec = model_spec_from_hf_config(model.config)
    fused, per_expert = _hf_state(model), _saved_state(model, tmp_path)
    assert detect_expert_layout(fused) == "fused" and detect_expert_layout(per_expert) == "per_expert"
    assert "model.layers.0.mlp.experts.3.gate_proj.weight" in per_expert
    from_fused = hf_to_megatron(fused, spec, te_spec=te_spec)
    from_files = hf_to_megatron(per_expert, spec, te_spec=te_spec)
    assert from_fused.keys() == from_files.keys()
    for name, tensor in from_fused.items():
        assert torch.equal(tensor, from_files[name]), name
    back = megatron_to_hf(from_fused, spec, te_spec=te_spec, expert_layout="per_expert")
    tied = {"lm_head.weight"} if spec.tie_word_embeddings else set()
    assert back.keys() == per_expert.keys() - tied
    for name, tensor in back.items():
        assert torch.equal(tensor, per_expert[name]), name
    stream = MegatronToHFStream(spec, te_spec=te_spec, expert_layout="per_expert")
    streamed = dict(stream.convert_all(iter(reversed(list(from_fused.items())))))
    assert streamed.keys() == back.keys() and all(torch.equal(streamed[n], back[n]) for n in back)
    with pytest.raises(ValueError, match="expert_layout 'stacked': use one of per_expert, fused"):
        megatron_to_hf(from_fused, spec, expert_layout="stacked")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("engine", "transformers_version", "layout"),
    [
        ("vllm", "4.57.1", "per_expert"),
        ("vllm", "5.24.0", "per_expert"),  # vLLM loads per-expert names whatever the trainer's transformers
        ("auto", "5.24.0", "per_expert"),  # auto picks vllm on the GPU machines Megatron runs on
        ("transformers", "5.24.0", "fused"),
        ("transformers", "4.57.1", "per_expert"),
    ],
)
def test_weight_syncs_send_experts_in_the_layout_the_engine_loads(
    engine: str, transformers_version: str, layout: str
) -> None:
    from telescope.megatron.mapping.rules import inference_expert_layout

    assert inference_expert_layout(engine, transformers_version) == layout


class RecordingSource(dict):  # type: ignore[type-arg]
    """An HF state dict that records which tensors were read."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.read: list[str] = []

    def __getitem__(self, name: str) -> torch.Tensor:
        self.read.append(name)
        return super().__getitem__(name)


@pytest.mark.parametrize("kind", ["qwen2", "qwen3_moe"])
def test_megatron_tensors_read_from_the_checkpoint_files_equal_the_whole_model_conversion(
    tiny_models, tmp_path, kind: str
) -> None:
    from telescope.megatron.mapping.source import MegatronFromHF, open_hf_checkpoint

    model = tiny_models(kind)
    spec = model_spec_from_hf_config(model.config)
    model.save_pretrained(tmp_path)
    checkpoint = open_hf_checkpoint(str(tmp_path))
    assert checkpoint is not None and len(checkpoint) > 0
    lazy = MegatronFromHF(checkpoint, spec, te_spec=True, padded_vocab=128)
    assert lazy.missing() == []
    whole = hf_to_megatron(_hf_state(model), spec, te_spec=True, padded_vocab=128)
    for name in reversed(list(whole)):  # any order
        assert torch.equal(lazy.get(name), whole[name]), name
    with pytest.raises(KeyError, match="has no HF source tensor"):
        lazy.get("decoder.layers.99.mlp.linear_fc2.weight")


def test_a_rank_reads_only_the_hf_tensors_of_what_it_holds(tiny_models) -> None:
    from telescope.megatron.mapping.source import MegatronFromHF

    model = tiny_models("qwen3_moe")
    spec = model_spec_from_hf_config(model.config)
    source = RecordingSource(_hf_state(model))
    lazy = MegatronFromHF(source, spec, te_spec=False, padded_vocab=128)
    lazy.get("decoder.layers.2.self_attention.linear_qkv.weight")
    assert sorted(source.read) == [f"model.layers.2.self_attn.{p}_proj.weight" for p in "kqv"]
    source.read.clear()
    lazy.get("decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight")
    lazy.get("decoder.layers.0.mlp.experts.local_experts.2.linear_fc1.weight")  # same fused rule: no reread
    assert source.read == ["model.layers.0.mlp.experts.gate_up_proj"]


def test_a_folder_without_safetensors_is_left_to_from_pretrained(tmp_path) -> None:
    from telescope.megatron.mapping.source import open_hf_checkpoint

    assert open_hf_checkpoint(str(tmp_path)) is None
