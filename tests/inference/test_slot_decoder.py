"""``SlotDecoder`` (the engine's decode step for Llama-family models) against the Hugging Face forward.

Each check feeds rows of different lengths one token at a time, rows joining and leaving between
steps, and compares every step's logits with a full forward of that row's whole sequence alone;
prefill (a padded batch of prompts) is compared with each prompt's own forward.
The Qwen3 and Llama models are random tiny ones built here (their own code paths: per-head
query/key norms; no biases), the Qwen2 one is the packaged tiny model.
"""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest
import torch

from telescope.core.inference.transformers_engine.core import EngineOptions, GenerationEngine
from telescope.core.inference.transformers_engine.decoder import SlotDecoder, supports
from telescope.core.inference.transformers_engine.sampling import SamplingParams
from telescope.core.inference.transformers_engine.scheduler import RequestState, Sequence


def random_model(kind: str) -> Any:
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    torch.manual_seed(0)
    common: dict[str, Any] = {
        "vocab_size": 97,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
    }
    config = Qwen3Config(head_dim=16, **common) if kind == "qwen3" else LlamaConfig(**common)
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.fixture(params=["qwen2", "qwen3", "llama"])
def model(request: pytest.FixtureRequest, tiny_path: str) -> Any:
    if request.param == "qwen2":
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(tiny_path).eval()
    return random_model(request.param)


def reference_logits(model: Any, ids: list[int]) -> torch.Tensor:
    """Last-position logits of a forward over ``ids`` alone (no cache, no padding)."""
    return model(torch.tensor([ids])).logits[0, -1].float()


def prompt_kv(model: Any, ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = model(torch.tensor([ids]), use_cache=True)
    return [(layer.keys, layer.values) for layer in out.past_key_values.layers]


def test_steps_equal_whole_sequence_forwards_as_rows_join_and_leave(model: Any) -> None:
    assert supports(model)
    rng = random.Random(0)
    vocab = int(model.config.vocab_size)
    seqs = [[rng.randrange(vocab) for _ in range(n)] for n in (5, 17, 2, 70, 9)]
    decoder = SlotDecoder(model, max_rows=8, max_len=128)
    worst = 0.0
    with torch.inference_mode():
        running = seqs[:3]
        decoder.add([prompt_kv(model, s[:-1]) for s in running])
        for step in range(12):
            logits = decoder.step(torch.tensor([s[-1] for s in running]))
            for row, seq in enumerate(running):
                worst = max(worst, float((logits[row].float() - reference_logits(model, seq)).abs().max()))
            nxt = logits.argmax(-1).tolist()
            running = [s + [t] for s, t in zip(running, nxt, strict=True)]
            if step == 3:  # rows leave and the rest move (reordered)
                decoder.keep([2, 0])
                running = [running[2], running[0]]
            if step == 5:  # longer rows join: the cache grows in both directions
                decoder.add([prompt_kv(model, s[:-1]) for s in seqs[3:]])
                running += seqs[3:]
    assert worst < 1e-4, f"largest logit difference {worst:.2e}"
    assert decoder.tokens == sum(len(s) - 1 for s in running)


def test_prefill_equals_each_prompts_own_forward(model: Any) -> None:
    """A right-padded batch of prompts (lengths 1 to 40): each prompt's last logits and keys/values
    equal a forward of that prompt alone, and decoding on from them equals whole-sequence forwards."""
    rng = random.Random(2)
    vocab = int(model.config.vocab_size)
    prompts = [[rng.randrange(vocab) for _ in range(n)] for n in (7, 1, 40, 13)]
    decoder = SlotDecoder(model, max_rows=8, max_len=128)
    worst = 0.0
    with torch.inference_mode():
        kv, logits = decoder.prefill(prompts)
        for prompt, layers, row_logits in zip(prompts, kv, logits, strict=True):
            worst = max(worst, float((row_logits.float() - reference_logits(model, prompt)).abs().max()))
            for (k, v), (rk, rv) in zip(layers, prompt_kv(model, prompt), strict=True):
                assert k.shape == rk.shape
                worst = max(worst, float((k - rk).abs().max()), float((v - rv).abs().max()))
        decoder.add(kv)
        seqs = [p + [int(t)] for p, t in zip(prompts, logits.argmax(-1), strict=True)]
        for _ in range(3):
            step = decoder.step(torch.tensor([s[-1] for s in seqs]))
            for row, seq in enumerate(seqs):
                worst = max(worst, float((step[row].float() - reference_logits(model, seq)).abs().max()))
            seqs = [s + [int(t)] for s, t in zip(seqs, step.argmax(-1), strict=True)]
    assert worst < 1e-4, f"largest difference {worst:.2e}"


def run_engine(model: Any, prompts: list[list[int]], slot: bool, **params: Any) -> list[Sequence]:
    options = EngineOptions(64, 256, "fcfs", 0, frozenset(), slot_decoder=slot)
    engine = GenerationEngine(model, options)
    done = threading.Event()
    request = RequestState("r", 0, lambda _: done.set())
    request.sequences = [Sequence(request, i, p, SamplingParams(**params)) for i, p in enumerate(prompts)]
    engine.submit(request)
    assert done.wait(60)
    engine.stop()
    return request.sequences


def test_engine_greedy_equals_generate_on_both_decode_paths(model: Any) -> None:
    rng = random.Random(1)
    vocab = int(model.config.vocab_size)
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in (4, 11, 7)]
    for slot in (True, False):
        seqs = run_engine(model, prompts, slot, temperature=0.0, max_tokens=12, ignore_eos=True)
        for prompt, seq in zip(prompts, seqs, strict=True):
            expected = model.generate(
                torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0
            )[0, len(prompt) :]
            assert seq.output_ids == expected.tolist(), f"slot_decoder={slot}"


def test_sampled_logprobs_equal_a_log_softmax_of_the_whole_sequence(model: Any) -> None:
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15, 16]]
    seqs = run_engine(model, prompts, True, temperature=0.8, max_tokens=10, ignore_eos=True, top_logprobs=2)
    for seq in seqs:
        with torch.no_grad():
            logits = model(torch.tensor([seq.prompt_ids + seq.output_ids])).logits[0].float()
        logp = torch.log_softmax(logits / 0.8, dim=-1)[len(seq.prompt_ids) - 1 : -1]
        expected = logp.gather(1, torch.tensor(seq.output_ids).unsqueeze(1)).squeeze(1)
        assert torch.allclose(torch.tensor(seq.logprobs), expected, atol=1e-5)
        top = logp.topk(2, dim=-1)
        assert [[t for t, _ in alts] for alts in seq.top_logprobs] == top.indices.tolist()


def test_other_architectures_keep_the_hugging_face_forward() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50)).eval()
    assert not supports(gpt2)
    engine = GenerationEngine(gpt2, EngineOptions(4, 64, "fcfs", 0, frozenset()))
    try:
        assert not isinstance(engine.batch, SlotDecoder)
    finally:
        engine.stop()


def test_in_place_weight_updates_reach_the_fused_projections(tiny_path: str) -> None:
    """The engine fuses q/k/v and gate/up into one tensor each; a weight update written into the
    modules' parameters in place (as ``weights.load`` does) must change what it decodes, exactly as
    the same update changes an untouched copy of the model."""
    import copy

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_path).eval()
    reference = copy.deepcopy(model)
    options = EngineOptions(8, 256, "fcfs", 0, frozenset())
    engine = GenerationEngine(model, options)
    prompt = [5, 9, 14, 3, 8]
    names = ["model.layers.0.self_attn.k_proj.weight", "model.layers.1.mlp.up_proj.weight"]
    gen = torch.Generator().manual_seed(3)
    updates = {n: torch.randn(dict(model.named_parameters())[n].shape, generator=gen) for n in names}

    def greedy() -> list[int]:
        done = threading.Event()
        request = RequestState(f"r{random.random()}", 0, lambda _: done.set())
        params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
        request.sequences = [Sequence(request, 0, prompt, params)]
        engine.submit(request)
        assert done.wait(60)
        return request.sequences[0].output_ids

    def expected() -> list[int]:
        out = reference.generate(
            torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0
        )
        return out[0, len(prompt) :].tolist()

    try:
        before = expected()
        assert greedy() == before
        params = dict(model.named_parameters())
        engine.run_between_steps(lambda: [params[n].data.copy_(t) for n, t in updates.items()])
        with torch.no_grad():
            for n, t in updates.items():
                dict(reference.named_parameters())[n].copy_(t)
        after = expected()
        assert after != before, "the update changes greedy decoding"
        assert greedy() == after
    finally:
        engine.stop()
