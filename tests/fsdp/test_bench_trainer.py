"""bench/trainer.py's padded baseline does the same work as the packed path: its TRL-layout and
right-padded rows give every completion token the logprob of a one-sequence-at-a-time forward."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.mark.parametrize("layout", ["trl", "right"])
def test_padded_rows_give_per_sequence_logprobs(
    tiny_model_dir: str, layout: str, bench_script: Callable[[str], ModuleType]
) -> None:
    from fsdp_helpers import make_samples
    from transformers import AutoModelForCausalLM

    from telescope.core.algorithms.logprobs import token_logprobs

    bench = bench_script("trainer")
    model = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa"
    )
    samples = make_samples(5, seed=2)
    ids, attn, targets, mask = (bench.trl_rows if layout == "trl" else bench.right_rows)(samples)
    assert int(attn.sum()) == sum(s.length for s in samples)
    assert int(mask.sum()) == sum(len(s.completion_ids) for s in samples)
    keep = targets.shape[1] + 1 if layout == "trl" else 0
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, use_cache=False, logits_to_keep=keep).logits[
            :, :-1
        ]
        padded = token_logprobs(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).view_as(mask)
        for r, s in enumerate(samples):
            seq = torch.tensor([list(s.prompt_ids) + list(s.completion_ids)])
            ref = token_logprobs(model(input_ids=seq, use_cache=False).logits[0, :-1], seq[0, 1:])
            torch.testing.assert_close(
                padded[r][mask[r] > 0], ref[len(s.prompt_ids) - 1 :], atol=1e-5, rtol=0
            )


def test_length_distributions_stay_in_range(bench_script: Callable[[str], ModuleType]) -> None:
    bench = bench_script("trainer")
    for dist in ("rl", "uniform"):
        samples = bench.make_samples(200, 512, 64, 0, (8, 32), dist)
        assert all(16 <= len(s.completion_ids) and s.length <= 512 for s in samples), dist
    with pytest.raises(ValueError, match="unknown length distribution 'zipf'"):
        bench.make_samples(1, 512, 64, 0, (8, 32), "zipf")
