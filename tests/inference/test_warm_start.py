"""The demo model's supervised warm start: its loss, and what label smoothing leaves behind."""

from __future__ import annotations

import random
from typing import Any

import torch

from telescope.core.models.warmstart import _batch, warm_start_reverse


def _load(path: str) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def test_first_loss_is_transformers_own_causal_lm_loss(tiny_path: str) -> None:
    # With one step the returned loss is the untrained model's on the first batch: without
    # smoothing it must be what transformers computes from the same labels (shift, ignore -100).
    model, tok = _load(tiny_path)
    reference = {k: v.clone() for k, v in model.state_dict().items()}  # the step updates in place
    loss = warm_start_reverse(model, tok, steps=1, seed=5)
    model.load_state_dict(reference)
    eos = int(tok.convert_tokens_to_ids(tok.eos_token))
    ids, labels = _batch(tok, random.Random("warm-start:5"), 16, eos)
    with torch.no_grad():
        expected = float(model(input_ids=ids, labels=labels).loss)
    assert abs(loss - expected) < 1e-5


def test_label_smoothing_leaves_the_skill_under_confident(tiny_path: str) -> None:
    # Same steps and batches: the smoothed model puts less probability on its own best answer
    # token, so sampling at temperature 1 strays from what greedy decoding would say.
    def answer_confidence(smoothing: float) -> float:
        model, tok = _load(tiny_path)
        warm_start_reverse(model, tok, steps=60, seed=3, lr=1e-2, label_smoothing=smoothing)
        eos = int(tok.convert_tokens_to_ids(tok.eos_token))
        ids, labels = _batch(tok, random.Random("held-out"), 16, eos)
        with torch.no_grad():
            probs = model(input_ids=ids).logits[:, :-1].softmax(-1)
        answer = labels[:, 1:] != -100
        return float(probs.max(-1).values[answer].mean())

    plain, smoothed = answer_confidence(0.0), answer_confidence(0.2)
    assert smoothed < 0.8 * plain, (plain, smoothed)  # measured: 0.221 plain, 0.143 smoothed
