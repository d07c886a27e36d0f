"""LoRA on the FSDP backend (one CPU rank): only adapters train, are optimised, synced and checkpointed."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from fsdp_helpers import backend_for, make_samples, step, tiny_config  # noqa: E402

from telescope.core.packing import Packer  # noqa: E402
from telescope.core.trainer import RankBatch  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_rank_group")

RANK = 4
HIDDEN = 64  # fsdp_helpers.save_tiny_qwen2: hidden 64, intermediate 128, 4 heads, 2 KV heads, 2 layers


def weights(backend: Any) -> dict[str, Any]:
    """What a sync sends, copied (on one rank a gathered tensor can alias the live parameter)."""
    return {k: v.clone() for k, v in backend.iter_weights_for_inference()}


def lora_cfg(model_dir: str, **overrides: Any) -> Any:
    return tiny_config(model_dir, lora_rank=RANK, lora_alpha=8.0, learning_rate=5e-2, **overrides)


def expected_adapter_shapes() -> dict[str, tuple[int, int]]:
    """(in, out) of every linear layer of the tiny Qwen2, from its config (head dim 16)."""
    head, kv = HIDDEN // 4, 2
    per_layer = {
        "self_attn.q_proj": (HIDDEN, HIDDEN),
        "self_attn.k_proj": (HIDDEN, kv * head),
        "self_attn.v_proj": (HIDDEN, kv * head),
        "self_attn.o_proj": (HIDDEN, HIDDEN),
        "mlp.gate_proj": (HIDDEN, 2 * HIDDEN),
        "mlp.up_proj": (HIDDEN, 2 * HIDDEN),
        "mlp.down_proj": (2 * HIDDEN, HIDDEN),
    }
    return {f"model.layers.{i}.{m}": shape for i in range(2) for m, shape in per_layer.items()}


def test_only_adapters_train_and_are_synced(tiny_model_dir: str) -> None:
    cfg = lora_cfg(tiny_model_dir)
    backend = backend_for(cfg, optimizer="adamw")
    shapes = expected_adapter_shapes()
    adapter_numel = sum(RANK * (i + o) for i, o in shapes.values())
    assert backend.info["trainable_parameters"] == adapter_numel
    assert backend.info["total_parameters"] > 10 * adapter_numel
    optimised = [p for g in backend.state.optimizer.param_groups for p in g["params"]]
    assert sum(p.numel() for p in optimised) == adapter_numel
    base_before = {
        n: p.full_tensor().clone() for n, p in backend.state.model.named_parameters() if "lora_" not in n
    }
    sent0 = weights(backend)
    # PEFT's file names, A [r, in] and B [out, r]; B starts at zero (the adapter starts as a no-op)
    want = {
        f"base_model.model.{m}.lora_{ab}.weight": (RANK, i) if ab == "A" else (o, RANK)
        for m, (i, o) in shapes.items()
        for ab in "AB"
    }
    assert {n: tuple(t.shape) for n, t in sent0.items()} == want
    assert all(float(t.abs().max()) == 0 for n, t in sent0.items() if ".lora_B." in n)
    for k in range(3):
        step(backend, make_samples(6, seed=k), cfg, k)
    sent = weights(backend)
    assert sum(t.numel() * t.element_size() for t in sent.values()) == adapter_numel * 4
    assert any(float((sent[n] - sent0[n]).abs().max()) > 0 for n in sent if ".lora_B." in n)
    for n, p in backend.state.model.named_parameters():
        if "lora_" not in n:  # the base model is frozen: bit for bit what was loaded
            torch.testing.assert_close(p.full_tensor(), base_before[n], atol=0, rtol=0)


def test_trainer_logprobs_are_base_plus_merged_adapter(tiny_model_dir: str) -> None:
    """An independent model: plain transformers with W + (alpha/r) B A merged by hand. The adapter
    trained must matter (every module's B A non-zero, the merged model's logprobs far from the
    base model's), or both sides would equal the base model and the comparison prove nothing."""
    from transformers import AutoModelForCausalLM

    from telescope.core.algorithms.logprobs import token_logprobs
    from telescope.core.training.tensors import move_to_device, prepare_tensors
    from telescope.fsdp.microbatch import packed_logits

    cfg = lora_cfg(tiny_model_dir)
    backend = backend_for(cfg, optimizer="sgd")
    for k in range(2):
        step(backend, make_samples(6, seed=10 + k), cfg, k)
    sent = weights(backend)

    def load() -> Any:
        return AutoModelForCausalLM.from_pretrained(
            tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa"
        )

    base, merged = load(), load()
    state = merged.state_dict()
    for module in expected_adapter_shapes():
        a, b = (
            sent[f"base_model.model.{module}.lora_A.weight"],
            sent[f"base_model.model.{module}.lora_B.weight"],
        )
        delta = (cfg.lora_alpha / RANK) * b @ a
        assert float(delta.abs().max()) > 0, f"{module}: the adapter is still a no-op"
        state[f"{module}.weight"] = state[f"{module}.weight"] + delta
    merged.load_state_dict(state)
    samples = make_samples(4, seed=99)
    packer = Packer(cfg.seq_len, cfg.pad_to_multiple_of, 1)
    batch = RankBatch.from_packed(packer.pack(samples), 0, 0)
    adapter_effect = 0.0
    for mb in batch.micro_batches:
        dev = move_to_device(mb, prepare_tensors(mb), backend.state.device)
        with torch.no_grad():
            got = token_logprobs(packed_logits(backend.state.model, dev), dev.targets, 1.0, 16)
            want = token_logprobs(packed_logits(merged, dev), dev.targets, 1.0, 16)
            plain = token_logprobs(packed_logits(base, dev), dev.targets, 1.0, 16)
        mask = dev.loss_mask.bool()
        torch.testing.assert_close(got[mask], want[mask], atol=2e-5, rtol=0)
        adapter_effect = max(adapter_effect, float((want[mask] - plain[mask]).abs().max()))
    assert adapter_effect > 100 * 2e-5, f"the adapter moved logprobs by {adapter_effect:.2e} only"


def test_checkpoint_holds_adapters_only_and_resumes_exactly(tiny_model_dir: str, tmp_path: Any) -> None:
    from torch.distributed.checkpoint import FileSystemReader

    cfg = lora_cfg(tiny_model_dir, lr_scheduler="cosine", number_of_steps=4)
    backend = backend_for(cfg, optimizer="adamw")
    step(backend, make_samples(5, seed=0), cfg, 0)
    backend.save_checkpoint(str(tmp_path / "ckpt"))
    keys = FileSystemReader(str(tmp_path / "ckpt")).read_metadata().state_dict_metadata
    model_keys = {k for k in keys if k.startswith("model.")}
    assert len(model_keys) == 2 * len(expected_adapter_shapes())
    assert all(".lora_A." in k or ".lora_B." in k for k in model_keys)
    saved = weights(backend)
    step(backend, make_samples(5, seed=1), cfg, 1)
    w1 = weights(backend)

    fresh = backend_for(cfg, optimizer="adamw")  # a new process's backend: base model + initial adapters
    fresh.load_checkpoint(str(tmp_path / "ckpt"))
    for name, w in fresh.iter_weights_for_inference():
        torch.testing.assert_close(w, saved[name], atol=0, rtol=0)
    step(fresh, make_samples(5, seed=1), cfg, 1)
    for name, w in fresh.iter_weights_for_inference():  # AdamW moments and LR restored: the same update
        torch.testing.assert_close(w, w1[name], atol=1e-7, rtol=0)

    full = backend_for(tiny_config(tiny_model_dir))
    with pytest.raises(ValueError, match="LoRA checkpoint.*lora_rank: 4"):
        full.load_checkpoint(str(tmp_path / "ckpt"))


def test_target_modules_restrict_the_adapters(tiny_model_dir: str) -> None:
    cfg = lora_cfg(tiny_model_dir, lora_target_modules=["q_proj", "v_proj"])
    backend = backend_for(cfg)
    names = sorted(dict(backend.iter_weights_for_inference()))
    assert len(names) == 2 * 2 * 2 and all(".q_proj." in n or ".v_proj." in n for n in names)
    with pytest.raises(ValueError, match="lora_target_modules"):
        backend_for(lora_cfg(tiny_model_dir, lora_target_modules=["no_such_proj"]))
