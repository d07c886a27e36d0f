"""Tiny random HF models built locally from transformers configs (shared by the megatron tests)."""

from __future__ import annotations

import torch
import transformers

COMMON = {"vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4}


def build_tiny_hf(kind: str):  # type: ignore[no-untyped-def]
    """A tiny random model of ``kind`` (one of ``MODEL_KINDS``), eval mode, seeded."""
    torch.manual_seed(0)
    if kind == "qwen2":
        cfg = transformers.Qwen2Config(
            **COMMON, intermediate_size=48, num_key_value_heads=2, tie_word_embeddings=False
        )
        model = transformers.Qwen2ForCausalLM(cfg)
    elif kind == "qwen2_tied":
        cfg = transformers.Qwen2Config(
            **COMMON, intermediate_size=48, num_key_value_heads=2, tie_word_embeddings=True
        )
        model = transformers.Qwen2ForCausalLM(cfg)
    elif kind == "qwen3":  # head_dim 16 != hidden/heads: Megatron's kv_channels
        cfg = transformers.Qwen3Config(**COMMON, intermediate_size=48, num_key_value_heads=2, head_dim=16)
        model = transformers.Qwen3ForCausalLM(cfg)
    elif kind == "llama":  # multi-query: one kv head for all 4 query heads
        cfg = transformers.LlamaConfig(**COMMON, intermediate_size=48, num_key_value_heads=1)
        model = transformers.LlamaForCausalLM(cfg)
    elif kind == "qwen3_moe":  # layer 1 dense (mlp_only_layers), layers 0 and 2 MoE
        cfg = transformers.Qwen3MoeConfig(
            **{**COMMON, "num_hidden_layers": 3},
            intermediate_size=48,
            moe_intermediate_size=16,
            num_key_value_heads=2,
            head_dim=8,
            num_experts=4,
            num_experts_per_tok=2,
            mlp_only_layers=[1],
        )
        model = transformers.Qwen3MoeForCausalLM(cfg)
    else:
        raise ValueError(kind)
    with torch.no_grad():  # norms start at exactly 1.0: randomise so mix-ups show
        for p in model.parameters():
            if p.dim() == 1:
                p.copy_(torch.randn_like(p))
    return model.eval()


MODEL_KINDS = ["qwen2", "qwen2_tied", "qwen3", "llama", "qwen3_moe"]
