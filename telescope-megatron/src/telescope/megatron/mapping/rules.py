"""One table of conversion rules drives both directions of the HF <-> Megatron mapping.

A ``Rule`` ties a tuple of HF names to a tuple of Megatron names with a function each way, so
every tensor of both models is covered exactly once and the round trip is exact by construction
(each ``to_hf`` is the inverse of its ``to_megatron``).

Megatron names are those of ``GPTModel`` (``decoder.layers.N...``). With the TransformerEngine
spec (``te_spec=True``) the pre-attention and pre-MLP norms live inside the fused
``linear_qkv`` / ``linear_fc1`` modules (``layer_norm_weight``) and grouped experts are named
``linear_fc1.weight<e>``; with the local spec they are separate modules and experts are
``local_experts.<e>.linear_fc1.weight``. Expert numbers here are global (EP renumbers them).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

import torch

from telescope.megatron.mapping.fuse import (
    fuse_gate_up,
    fuse_qkv,
    pad_vocab,
    split_gate_up,
    split_qkv,
    unpad_vocab,
)
from telescope.megatron.mapping.spec import ModelSpec

__all__ = [
    "EXPERT_LAYOUTS",
    "ExpertLayout",
    "Rule",
    "conversion_rules",
    "detect_expert_layout",
    "inference_expert_layout",
]

Tensors = list[torch.Tensor]

#: How an HF MoE checkpoint names its experts. ``per_expert``: ``mlp.experts.<e>.gate_proj.weight``
#: ``[I, H]``, ``up_proj`` and ``down_proj`` ``[H, I]`` per expert: the hub's files, transformers < 5
#: and vLLM 0.16/0.17 (which pin transformers < 5) load these; transformers 5 converts them on load.
#: ``fused``: transformers 5's in-memory modules, ``mlp.experts.gate_up_proj`` ``[E, 2I, H]`` (gate
#: rows then up rows per expert) and ``mlp.experts.down_proj`` ``[E, H, I]``.
ExpertLayout = Literal["per_expert", "fused"]
EXPERT_LAYOUTS: tuple[ExpertLayout, ...] = ("per_expert", "fused")
_PER_EXPERT_NAME = re.compile(r"\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$")


def inference_expert_layout(inference_engine: str, transformers_version: str) -> ExpertLayout:
    """The layout weight syncs send experts in: vLLM (``auto`` picks it on the GPU machines Megatron
    runs on) loads per-expert names; the transformers engine loads its own modules' names, fused
    from transformers 5 on."""
    if inference_engine == "transformers" and int(transformers_version.split(".")[0]) >= 5:
        return "fused"
    return "per_expert"


def detect_expert_layout(hf_names: Iterable[str]) -> ExpertLayout:
    """The expert layout of an HF state dict's names (``fused`` when it has no per-expert names)."""
    return "per_expert" if any(_PER_EXPERT_NAME.search(n) for n in hf_names) else "fused"


@dataclass(frozen=True)
class Rule:
    """HF tensors ``hf`` <-> Megatron tensors ``megatron`` (same order as the names)."""

    hf: tuple[str, ...]
    megatron: tuple[str, ...]
    to_megatron: Callable[[Tensors], Tensors]
    to_hf: Callable[[Tensors], Tensors]


def _same(hf: str, meg: str) -> Rule:
    return Rule((hf,), (meg,), lambda t: t, lambda t: t)


def conversion_rules(
    spec: ModelSpec, *, te_spec: bool, padded_vocab: int, expert_layout: ExpertLayout = "fused"
) -> list[Rule]:
    """Every rule for ``spec``: embeddings, each layer, final norm, output layer; MoE experts on
    the HF side in ``expert_layout``."""
    if expert_layout not in EXPERT_LAYOUTS:
        raise ValueError(f"expert_layout {expert_layout!r}: use one of {', '.join(EXPERT_LAYOUTS)}")
    vocab_rule = Rule(
        ("model.embed_tokens.weight",),
        ("embedding.word_embeddings.weight",),
        lambda t: [pad_vocab(t[0], padded_vocab)],
        lambda t: [unpad_vocab(t[0], spec.vocab_size)],
    )
    rules = [vocab_rule]
    for layer in range(spec.num_layers):
        rules += _attention_rules(spec, layer, te_spec)
        if spec.is_moe_layer(layer):
            rules += _moe_rules(spec, layer, te_spec, expert_layout)
        else:
            rules += _mlp_rules(layer, te_spec)
    rules.append(_same("model.norm.weight", "decoder.final_layernorm.weight"))
    if not spec.tie_word_embeddings:
        rules.append(
            Rule(
                ("lm_head.weight",),
                ("output_layer.weight",),
                lambda t: [pad_vocab(t[0], padded_vocab)],
                lambda t: [unpad_vocab(t[0], spec.vocab_size)],
            )
        )
    return rules


def _attention_rules(spec: ModelSpec, layer: int, te_spec: bool) -> list[Rule]:
    hf, meg = f"model.layers.{layer}.", f"decoder.layers.{layer}."
    attn = f"{meg}self_attention."
    norm = f"{attn}linear_qkv.layer_norm_weight" if te_spec else f"{meg}input_layernorm.weight"
    rules = [
        _same(f"{hf}input_layernorm.weight", norm),
        _qkv_rule(spec, f"{hf}self_attn.", f"{attn}linear_qkv.", "weight"),
        _same(f"{hf}self_attn.o_proj.weight", f"{attn}linear_proj.weight"),
    ]
    if spec.qkv_bias:
        rules.append(_qkv_rule(spec, f"{hf}self_attn.", f"{attn}linear_qkv.", "bias"))
    if spec.qk_norm:
        rules.append(_same(f"{hf}self_attn.q_norm.weight", f"{attn}q_layernorm.weight"))
        rules.append(_same(f"{hf}self_attn.k_norm.weight", f"{attn}k_layernorm.weight"))
    return rules


def _qkv_rule(spec: ModelSpec, hf: str, meg: str, kind: str) -> Rule:
    return Rule(
        (f"{hf}q_proj.{kind}", f"{hf}k_proj.{kind}", f"{hf}v_proj.{kind}"),
        (f"{meg}{kind}",),
        lambda t: [fuse_qkv(t[0], t[1], t[2], spec)],
        lambda t: list(split_qkv(t[0], spec)),
    )


def _mlp_rules(layer: int, te_spec: bool) -> list[Rule]:
    hf, meg = f"model.layers.{layer}.", f"decoder.layers.{layer}."
    norm = f"{meg}mlp.linear_fc1.layer_norm_weight" if te_spec else f"{meg}pre_mlp_layernorm.weight"
    return [
        _same(f"{hf}post_attention_layernorm.weight", norm),
        Rule(
            (f"{hf}mlp.gate_proj.weight", f"{hf}mlp.up_proj.weight"),
            (f"{meg}mlp.linear_fc1.weight",),
            lambda t: [fuse_gate_up(t[0], t[1])],
            lambda t: list(split_gate_up(t[0])),
        ),
        _same(f"{hf}mlp.down_proj.weight", f"{meg}mlp.linear_fc2.weight"),
    ]


def expert_weight_name(layer: int, expert: int, linear: str, te_spec: bool) -> str:
    """Megatron name of expert ``expert``'s ``linear`` (``linear_fc1``/``linear_fc2``) weight."""
    base = f"decoder.layers.{layer}.mlp.experts."
    return f"{base}{linear}.weight{expert}" if te_spec else f"{base}local_experts.{expert}.{linear}.weight"


def _moe_rules(spec: ModelSpec, layer: int, te_spec: bool, expert_layout: ExpertLayout) -> list[Rule]:
    """Router, norm and experts of a MoE layer; experts in ``expert_layout`` (see ``ExpertLayout``).
    Megatron's per-expert ``linear_fc1`` is the gate rows then the up rows, like transformers 5's
    fused ``gate_up_proj`` row block of that expert."""
    hf, meg = f"model.layers.{layer}.", f"decoder.layers.{layer}."
    experts = range(spec.num_experts)
    shared = [
        _same(f"{hf}post_attention_layernorm.weight", f"{meg}pre_mlp_layernorm.weight"),
        _same(f"{hf}mlp.gate.weight", f"{meg}mlp.router.weight"),
    ]
    if expert_layout == "per_expert":
        per_expert: list[Rule] = []
        for e in experts:
            src = f"{hf}mlp.experts.{e}."
            per_expert.append(
                Rule(
                    (f"{src}gate_proj.weight", f"{src}up_proj.weight"),
                    (expert_weight_name(layer, e, "linear_fc1", te_spec),),
                    lambda t: [fuse_gate_up(t[0], t[1])],
                    lambda t: list(split_gate_up(t[0])),
                )
            )
            per_expert.append(
                _same(f"{src}down_proj.weight", expert_weight_name(layer, e, "linear_fc2", te_spec))
            )
        return shared + per_expert

    def stacked(linear: str, hf_name: str) -> Rule:
        return Rule(
            (hf_name,),
            tuple(expert_weight_name(layer, e, linear, te_spec) for e in experts),
            lambda t: [x.contiguous() for x in t[0].unbind(0)],
            lambda t: [torch.stack(t, dim=0)],
        )

    return shared + [
        stacked("linear_fc1", f"{hf}mlp.experts.gate_up_proj"),
        stacked("linear_fc2", f"{hf}mlp.experts.down_proj"),
    ]
