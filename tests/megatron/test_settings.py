"""Megatron config dicts built from the run config and the HF architecture."""

from __future__ import annotations

import enum

import pytest

from telescope.core.testing import make_config
from telescope.megatron.mapping import model_spec_from_hf_config
from telescope.megatron.options import MegatronBackendKwargs
from telescope.megatron.parallel import resolve_parallel_layout
from telescope.megatron.settings import (
    ddp_config_kwargs,
    gpt_model_kwargs,
    optimizer_config_kwargs,
    transformer_config_kwargs,
)

MOE = {
    "model_type": "qwen3_moe",
    "num_hidden_layers": 3,
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 48,
    "moe_intermediate_size": 16,
    "vocab_size": 100,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "mlp_only_layers": [1],
    "norm_topk_prob": True,
    "rope_theta": 1e6,
    "tie_word_embeddings": True,
}


def test_transformer_config_from_architecture_and_run() -> None:
    cfg = make_config(
        train_backend="megatron",
        trainer_num_workers=8,
        megatron_tensor_parallel_size=2,
        megatron_expert_parallel_size=2,
        megatron_use_transformer_engine=True,
        megatron_fp8=True,
    )
    spec = model_spec_from_hf_config(MOE)
    layout = resolve_parallel_layout(cfg, num_experts=spec.num_experts)
    kw = transformer_config_kwargs(spec, cfg, layout, MegatronBackendKwargs())
    assert (kw["num_query_groups"], kw["kv_channels"], kw["qk_layernorm"], kw["add_qkv_bias"]) == (
        2,
        16,
        True,
        False,
    )
    assert (
        kw["moe_layer_freq"] == [1, 0, 1] and kw["moe_router_topk"] == 2 and kw["moe_ffn_hidden_size"] == 16
    )
    assert kw["moe_router_pre_softmax"] is False and kw["moe_grouped_gemm"] is True
    assert kw["sequence_parallel"] is True and kw["tensor_model_parallel_size"] == 2
    assert kw["fp8"] == "hybrid" and kw["fp8_recipe"] == "delayed"
    assert kw["recompute_granularity"] == "full"  # megatron_gradient_checkpointing default true
    assert kw["bf16"] is True and kw["params_dtype"] == "bfloat16"  # mixed_precision_dtype default
    model_kw = gpt_model_kwargs(spec, cfg, padded_vocab=256)
    assert model_kw["share_embeddings_and_output_weights"] is True and model_kw["rotary_base"] == 1_000_000
    assert model_kw["vocab_size"] == 256


def test_dense_model_without_optional_features() -> None:
    cfg = make_config(
        train_backend="megatron",
        megatron_gradient_checkpointing=False,
        mixed_precision_dtype=None,
        model_dtype="float32",
    )
    spec = model_spec_from_hf_config({**MOE, "model_type": "qwen2", "num_experts": 0})
    kw = transformer_config_kwargs(spec, cfg, resolve_parallel_layout(cfg), MegatronBackendKwargs())
    assert "pipeline_dtype" not in kw  # only with pipeline parallelism
    assert "fp8" not in kw and "recompute_granularity" not in kw and "num_moe_experts" not in kw
    assert kw["add_qkv_bias"] is True and kw["bf16"] is False and kw["params_dtype"] == "float32"


def test_optimizer_and_ddp_configs() -> None:
    cfg = make_config(
        train_backend="megatron",
        learning_rate=3e-6,
        grad_clip=0.5,
        megatron_optimizer_cpu_offload=True,
        megatron_optimizer_offload_fraction=0.25,
        megatron_use_precision_aware_optimizer=True,
        megatron_exp_avg_dtype="bfloat16",
        megatron_grad_reduce_in_fp32=False,
    )
    opt = optimizer_config_kwargs(cfg, MegatronBackendKwargs(adam_beta2=0.98))
    assert (opt["lr"], opt["clip_grad"], opt["adam_beta2"], opt["loss_scale"]) == (3e-6, 0.5, 0.98, 1.0)
    assert opt["optimizer_cpu_offload"] and opt["optimizer_offload_fraction"] == 0.25
    assert opt["overlap_cpu_optimizer_d2h_h2d"] is True
    assert opt["use_precision_aware_optimizer"] and opt["exp_avg_dtype"] == "bfloat16"
    plain = optimizer_config_kwargs(make_config(), MegatronBackendKwargs())
    assert "optimizer_cpu_offload" not in plain and "use_precision_aware_optimizer" not in plain
    ddp = ddp_config_kwargs(cfg)
    assert ddp["grad_reduce_in_fp32"] is False and ddp["use_distributed_optimizer"] is True


class MegatronAttnBackend(enum.Enum):
    """Stand-in for ``megatron.core.transformer.enums.AttnBackend`` (megatron-core 0.19's members;
    Megatron-Core is not installed on CPU CI; test_megatron_core_cpu.py checks the real enum)."""

    flash = 1
    fused = 2
    unfused = 3
    local = 4
    auto = 5


def test_attention_backend_reaches_megatron_as_its_enum_not_a_string() -> None:
    from typing import get_args

    from telescope.megatron.model import materialize

    cfg = make_config(train_backend="megatron")
    spec = model_spec_from_hf_config({**MOE, "model_type": "qwen2", "num_experts": 0})
    layout = resolve_parallel_layout(cfg, 1)
    choices = get_args(MegatronBackendKwargs.model_fields["attention_backend"].annotation)
    for name in choices:
        kw = transformer_config_kwargs(spec, cfg, layout, MegatronBackendKwargs(attention_backend=name))
        backend = materialize(kw, attn_backend_enum=MegatronAttnBackend).get("attention_backend")
        # auto is Megatron's own default: not set
        assert backend is (None if name == "auto" else MegatronAttnBackend[name]), name
    with pytest.raises(ValueError, match="'flashy' is not one of Megatron's AttnBackend"):
        materialize({"attention_backend": "flashy"}, attn_backend_enum=MegatronAttnBackend)


def test_half_precision_logits_stay_in_the_compute_dtype_and_give_the_same_logprobs() -> None:
    from types import SimpleNamespace

    import torch

    from telescope.core.algorithms.logprobs import token_entropy, token_logprobs
    from telescope.megatron.step import model_call_kwargs

    assert model_call_kwargs(SimpleNamespace(bf16=True, fp16=False)) == {"fp32_output": False}
    assert model_call_kwargs(SimpleNamespace(bf16=False, fp16=True)) == {"fp32_output": False}
    assert model_call_kwargs(SimpleNamespace(bf16=False, fp16=False)) == {}  # no Float16Module: no such kwarg
    torch.manual_seed(0)
    logits = torch.randn(37, 300).bfloat16()
    targets = torch.randint(0, 300, (37,))
    chunked = token_logprobs(logits, targets, 0.7, chunk_size=8)
    upcast_first = token_logprobs(logits.float(), targets, 0.7, chunk_size=8)  # what fp32_output=True gave
    assert chunked.dtype == torch.float32 and torch.equal(chunked, upcast_first)
    assert torch.equal(token_entropy(logits, 0.7, 8), token_entropy(logits.float(), 0.7, 8))
