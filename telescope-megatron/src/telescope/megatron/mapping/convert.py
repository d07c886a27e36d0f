"""Whole-state-dict conversion both ways, and a streaming Megatron -> HF converter for weight sync."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from telescope.megatron.mapping.rules import ExpertLayout, Rule, conversion_rules, detect_expert_layout
from telescope.megatron.mapping.spec import ModelSpec

__all__ = ["MegatronToHFStream", "hf_to_megatron", "megatron_to_hf"]


def _apply(
    rules: list[Rule], source: Mapping[str, torch.Tensor], forward: bool, tied_extra: set[str]
) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    for rule in rules:
        src_names, dst_names = (rule.hf, rule.megatron) if forward else (rule.megatron, rule.hf)
        missing = [n for n in src_names if n not in source]
        if missing:
            side = "HF" if forward else "Megatron"
            raise KeyError(f"{side} state dict lacks {missing[:4]} (needed for {dst_names[:2]}...)")
        fn = rule.to_megatron if forward else rule.to_hf
        results = fn([source[n] for n in src_names])
        out.update(zip(dst_names, results, strict=True))
        used.update(src_names)
    extra = set(source) - used - tied_extra
    if extra:
        raise KeyError(
            f"no mapping for {len(extra)} tensor(s): {sorted(extra)[:6]}; is the model_type right?"
        )
    return out


def hf_to_megatron(
    hf_state: Mapping[str, torch.Tensor],
    spec: ModelSpec,
    *,
    te_spec: bool = False,
    padded_vocab: int | None = None,
) -> dict[str, torch.Tensor]:
    """Full (unsharded) Megatron state dict from an HF one. Unknown HF tensors are an error;
    ``lm_head.weight`` of a tied model is ignored (Megatron shares the embedding). MoE experts may
    come in either HF layout (``rules.ExpertLayout``: per expert, or transformers 5's fused tensors)."""
    rules = conversion_rules(
        spec,
        te_spec=te_spec,
        padded_vocab=padded_vocab or spec.vocab_size,
        expert_layout=detect_expert_layout(hf_state),
    )
    tied = {"lm_head.weight"} if spec.tie_word_embeddings else set()
    return _apply(rules, hf_state, forward=True, tied_extra=tied)


def megatron_to_hf(
    megatron_state: Mapping[str, torch.Tensor],
    spec: ModelSpec,
    *,
    te_spec: bool = False,
    expert_layout: ExpertLayout = "fused",
) -> dict[str, torch.Tensor]:
    """HF state dict from a full (TP-gathered, all experts) Megatron one; vocab padding dropped;
    MoE experts in ``expert_layout``.

    Megatron's TE modules also carry ``_extra_state`` entries (FP8 metadata); they are skipped.
    """
    source = {k: v for k, v in megatron_state.items() if not k.endswith("._extra_state")}
    rules = conversion_rules(spec, te_spec=te_spec, padded_vocab=spec.vocab_size, expert_layout=expert_layout)
    return _apply(rules, source, forward=False, tied_extra=set())


class MegatronToHFStream:
    """Convert full Megatron tensors to HF ones as they arrive, holding back only partial groups.

    ``feed(name, tensor)`` returns the HF tensors completed by this one: a ``linear_qkv``
    yields q, k, v at once; a MoE layer's fused expert tensor is yielded once all its experts
    have arrived (so at most one layer's experts of one kind are buffered).
    """

    def __init__(
        self, spec: ModelSpec, *, te_spec: bool = False, expert_layout: ExpertLayout = "fused"
    ) -> None:
        self._rules = {}
        rules = conversion_rules(
            spec, te_spec=te_spec, padded_vocab=spec.vocab_size, expert_layout=expert_layout
        )
        for rule in rules:
            for name in rule.megatron:
                self._rules[name] = rule
        self._pending: dict[int, dict[str, torch.Tensor]] = {}

    def feed(self, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """HF ``(name, tensor)`` pairs completed by Megatron tensor ``name``."""
        if name.endswith("._extra_state"):
            return []
        rule = self._rules.get(name)
        if rule is None:
            raise KeyError(f"no HF mapping for Megatron parameter {name!r}")
        got = self._pending.setdefault(id(rule), {})
        got[name] = tensor
        if len(got) < len(rule.megatron):
            return []
        del self._pending[id(rule)]
        return list(zip(rule.hf, rule.to_hf([got[n] for n in rule.megatron]), strict=True))

    def finish(self) -> None:
        """Raise if some group never completed (a missing expert or a skipped TP gather)."""
        if self._pending:
            waiting = [n for got in self._pending.values() for n in got][:4]
            raise RuntimeError(f"Megatron -> HF stream ended with incomplete groups (have {waiting}...)")

    def convert_all(self, items: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """``feed`` every item, then ``finish``."""
        for name, tensor in items:
            yield from self.feed(name, tensor)
        self.finish()
