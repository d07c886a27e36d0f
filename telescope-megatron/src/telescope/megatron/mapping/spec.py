"""The architecture facts the mapping needs, read from a Hugging Face config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["SUPPORTED_MODEL_TYPES", "ModelSpec", "model_spec_from_hf_config"]

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "qwen3_moe")


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer as both HF and Megatron see it."""

    model_type: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    num_experts: int = 0
    """0 for dense models."""
    moe_top_k: int = 0
    moe_ffn_hidden_size: int = 0
    moe_norm_topk_prob: bool = True
    moe_layers: frozenset[int] = field(default_factory=frozenset)
    """Indices of the layers whose MLP is a mixture of experts."""

    @property
    def heads_per_group(self) -> int:
        """Query heads sharing one key/value head."""
        return self.num_attention_heads // self.num_key_value_heads

    def is_moe_layer(self, layer: int) -> bool:
        """True when layer ``layer`` has experts and a router instead of a dense MLP."""
        return layer in self.moe_layers

    def padded_vocab_size(self, divisible_by: int, tp: int) -> int:
        """Megatron's embedding rows: vocab rounded up to a multiple of ``divisible_by * tp``."""
        multiple = divisible_by * tp
        return -(-self.vocab_size // multiple) * multiple


def model_spec_from_hf_config(hf_config: Any) -> ModelSpec:
    """Read a ``transformers`` config (object or dict); raise ``ValueError`` for other architectures."""

    def get(key: str, default: Any = None) -> Any:
        if isinstance(hf_config, dict):
            return hf_config.get(key, default)
        return getattr(hf_config, key, default)

    model_type = get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model_type {model_type!r} has no Megatron weight mapping; supported: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} (use train_backend: fsdp for other models)"
        )
    heads = get("num_attention_heads")
    hidden = get("hidden_size")
    layers = get("num_hidden_layers")
    experts = int(get("num_experts", 0) or 0) if model_type == "qwen3_moe" else 0
    return ModelSpec(
        model_type=model_type,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=get("num_key_value_heads") or heads,
        head_dim=get("head_dim") or hidden // heads,
        ffn_hidden_size=get("intermediate_size"),
        vocab_size=get("vocab_size"),
        tie_word_embeddings=bool(get("tie_word_embeddings", False)),
        # Qwen2 always has q/k/v biases; Llama and Qwen3 have them only with attention_bias.
        qkv_bias=model_type == "qwen2" or bool(get("attention_bias", False)),
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        rms_norm_eps=float(get("rms_norm_eps", 1e-6)),
        rope_theta=float(_rope_theta(get)),
        max_position_embeddings=int(get("max_position_embeddings", 4096)),
        num_experts=experts,
        moe_top_k=int(get("num_experts_per_tok", 0) or 0) if experts else 0,
        moe_ffn_hidden_size=int(get("moe_intermediate_size", 0) or 0) if experts else 0,
        moe_norm_topk_prob=bool(get("norm_topk_prob", True)),
        moe_layers=frozenset(_moe_layers(get, layers)) if experts else frozenset(),
    )


def _rope_theta(get: Any) -> float:
    params = get("rope_parameters") or get("rope_scaling") or {}
    if isinstance(params, dict) and params.get("rope_type", "default") not in ("default", None):
        raise ValueError(
            f"rope scaling {params.get('rope_type')!r} is not mapped to Megatron yet; only plain RoPE is supported"
        )
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    return theta or get("rope_theta") or 10000.0


def _moe_layers(get: Any, num_layers: int) -> list[int]:
    """Qwen3-MoE: experts every ``decoder_sparse_step`` layers, except ``mlp_only_layers``."""
    step = int(get("decoder_sparse_step", 1) or 1)
    dense = set(get("mlp_only_layers", None) or [])
    return [i for i in range(num_layers) if i not in dense and (i + 1) % step == 0]
