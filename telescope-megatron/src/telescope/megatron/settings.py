"""Megatron-Core config objects as plain keyword dicts (torch-free, so CPU tests check them).

``transformer_config_kwargs`` -> ``megatron.core.transformer.TransformerConfig(**kw)``,
``optimizer_config_kwargs`` -> ``megatron.core.optimizer.OptimizerConfig(**kw)``,
``ddp_config_kwargs`` -> ``megatron.core.distributed.DistributedDataParallelConfig(**kw)``,
``gpt_model_kwargs`` -> ``GPTModel(config, spec, **kw)``. Field names follow megatron-core 0.19
(see reference/engines-and-apis.md §4); ``activation_func`` is given as the string "silu" and
turned into ``torch.nn.functional.silu`` by the backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from telescope.megatron.mapping.spec import ModelSpec
from telescope.megatron.options import MegatronBackendKwargs
from telescope.megatron.parallel import ParallelLayout

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["ddp_config_kwargs", "gpt_model_kwargs", "optimizer_config_kwargs", "transformer_config_kwargs"]


def _precision(cfg: TelescopeConfig) -> dict[str, Any]:
    dtype = cfg.mixed_precision_dtype or cfg.model_dtype
    return {"bf16": dtype == "bfloat16", "fp16": dtype == "float16", "params_dtype": dtype}


def transformer_config_kwargs(
    spec: ModelSpec, cfg: TelescopeConfig, layout: ParallelLayout, kwargs: MegatronBackendKwargs
) -> dict[str, Any]:
    """``TransformerConfig`` fields for ``spec`` trained with ``cfg``'s megatron settings."""
    kw: dict[str, Any] = {
        "num_layers": spec.num_layers,
        "hidden_size": spec.hidden_size,
        "ffn_hidden_size": spec.ffn_hidden_size,
        "num_attention_heads": spec.num_attention_heads,
        "num_query_groups": spec.num_key_value_heads,
        "kv_channels": spec.head_dim,
        "normalization": "RMSNorm",
        "layernorm_epsilon": spec.rms_norm_eps,
        "gated_linear_unit": True,
        "activation_func": "silu",
        "add_bias_linear": False,
        "add_qkv_bias": spec.qkv_bias,
        "qk_layernorm": spec.qk_norm,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,  # RL logprobs must be deterministic functions of the weights
        "bias_dropout_fusion": False,
        "tensor_model_parallel_size": layout.tensor,
        "pipeline_model_parallel_size": layout.pipeline,
        "context_parallel_size": layout.context,
        "expert_model_parallel_size": layout.expert,
        "sequence_parallel": layout.sequence_parallel,
        "variable_seq_lengths": True,  # packed rows differ in length from step to step
        # Megatron rejects the allgather dispatcher with variable lengths (checked for dense models too).
        "moe_token_dispatcher_type": "alltoall",
        "perform_initialization": False,  # weights come from the HF checkpoint
        "use_cpu_initialization": True,
        **_precision(cfg),
    }
    if layout.pipeline > 1:  # dtype of the activations sent between stages (required by Megatron)
        kw["pipeline_dtype"] = kw["params_dtype"]
    if cfg.megatron_gradient_checkpointing:
        kw.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    if cfg.megatron_fp8:
        kw.update(fp8="hybrid", fp8_recipe=kwargs.fp8_recipe)
    if kwargs.attention_backend != "auto":
        kw["attention_backend"] = kwargs.attention_backend
    if spec.num_experts:
        kw.update(_moe_kwargs(spec, cfg.megatron_use_transformer_engine))
    return kw


def _moe_kwargs(spec: ModelSpec, te: bool) -> dict[str, Any]:
    return {
        "num_moe_experts": spec.num_experts,
        "moe_router_topk": spec.moe_top_k,
        "moe_ffn_hidden_size": spec.moe_ffn_hidden_size,
        "moe_layer_freq": [1 if spec.is_moe_layer(i) else 0 for i in range(spec.num_layers)],
        # Qwen3-MoE norm_topk_prob=True == softmax over the top-k logits (Megatron's default
        # order); without it the probabilities come from a softmax over all experts first.
        "moe_router_pre_softmax": not spec.moe_norm_topk_prob,
        "moe_router_load_balancing_type": "none",  # RL: no auxiliary loss, router trained by the policy loss only
        "moe_aux_loss_coeff": 0.0,
        "moe_grouped_gemm": te,
        "moe_router_dtype": "fp32",
    }


def gpt_model_kwargs(spec: ModelSpec, cfg: TelescopeConfig, padded_vocab: int) -> dict[str, Any]:
    """``GPTModel`` keyword arguments (besides config and layer spec)."""
    return {
        "vocab_size": padded_vocab,
        "max_sequence_length": max(spec.max_position_embeddings, cfg.seq_len),
        "position_embedding_type": "rope",
        "rotary_base": int(spec.rope_theta),
        "rotary_percent": 1.0,
        "share_embeddings_and_output_weights": spec.tie_word_embeddings,
        "parallel_output": True,  # logits stay vocab-sharded; the loss gathers what it needs
    }


def optimizer_config_kwargs(cfg: TelescopeConfig, kwargs: MegatronBackendKwargs) -> dict[str, Any]:
    """``OptimizerConfig`` fields: Adam with the run's lr/weight decay/clip and the megatron_* memory knobs."""
    kw: dict[str, Any] = {
        "optimizer": "adam",
        "lr": cfg.learning_rate,
        "weight_decay": cfg.weight_decay,
        "adam_beta1": kwargs.adam_beta1,
        "adam_beta2": kwargs.adam_beta2,
        "adam_eps": kwargs.adam_eps,
        "clip_grad": cfg.grad_clip,
        "use_distributed_optimizer": cfg.megatron_use_distributed_optimizer,
        # A constant loss scale of 1 (a no-op for bf16) makes Megatron check the gradients for
        # inf/NaN and skip the update, like the FSDP backend; without a scaler bf16 steps with NaN.
        "loss_scale": 1.0,
        **{k: v for k, v in _precision(cfg).items() if k != "params_dtype"},
    }
    if cfg.megatron_optimizer_cpu_offload:
        kw.update(
            optimizer_cpu_offload=True,
            optimizer_offload_fraction=cfg.megatron_optimizer_offload_fraction,
            overlap_cpu_optimizer_d2h_h2d=cfg.megatron_overlap_cpu_optimizer_d2h_h2d,
        )
    if cfg.megatron_use_precision_aware_optimizer:
        kw.update(
            use_precision_aware_optimizer=True,
            main_grads_dtype=cfg.megatron_main_grads_dtype,
            main_params_dtype=cfg.megatron_main_params_dtype,
            exp_avg_dtype=cfg.megatron_exp_avg_dtype,
            exp_avg_sq_dtype=cfg.megatron_exp_avg_sq_dtype,
        )
    return kw


def ddp_config_kwargs(cfg: TelescopeConfig) -> dict[str, Any]:
    """``DistributedDataParallelConfig`` fields."""
    return {
        "grad_reduce_in_fp32": cfg.megatron_grad_reduce_in_fp32,
        "overlap_grad_reduce": cfg.megatron_overlap_grad_reduce,
        "use_distributed_optimizer": cfg.megatron_use_distributed_optimizer,
        "overlap_param_gather": False,  # weight sync and checkpoints read params right after the step
        "check_for_nan_in_grad": False,  # we count non-finite grad norms and skip the step ourselves
    }
