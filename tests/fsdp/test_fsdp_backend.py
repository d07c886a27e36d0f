"""FSDP backend on one CPU rank (gloo), checked against an unsharded model and hand formulas."""

from __future__ import annotations

import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from fsdp_helpers import backend_for, make_samples, step, tiny_config  # noqa: E402

from telescope.core.packing import Packer  # noqa: E402
from telescope.core.trainer import TrainSample  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_rank_group")


def weights(backend: Any) -> dict[str, Any]:
    return {k: v.clone() for k, v in backend.iter_weights_for_inference()}


def plain_model(model_dir: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")


def per_sample_logprobs(model: Any, s: TrainSample) -> Any:
    """Logprobs of the completion tokens, one unpacked sequence at a time."""
    ids = torch.tensor([list(s.prompt_ids) + list(s.completion_ids)])
    logp = torch.log_softmax(model(input_ids=ids, use_cache=False).logits[0, :-1].float(), dim=-1)
    targets = ids[0, 1:]
    return logp.gather(-1, targets[:, None])[:, 0][len(s.prompt_ids) - 1 :]


def test_packed_logprobs_equal_per_sequence_and_need_use_cache_off(tiny_model_dir: str) -> None:
    from telescope.core.algorithms.logprobs import token_logprobs
    from telescope.core.training.tensors import to_device
    from telescope.fsdp.microbatch import packed_logits

    model = plain_model(tiny_model_dir)  # config keeps the HF default use_cache=True
    assert model.config.use_cache
    samples = make_samples(6, seed=3)
    (row,) = Packer(seq_len=256, pad_to_multiple_of=8).pack(samples).per_rank[0]
    mb = to_device(row, torch.device("cpu"))
    packed = token_logprobs(packed_logits(model, mb), mb.targets)
    target_sample = row.sample_index[1:]
    for i, s in enumerate(samples):
        mask = torch.tensor([j == i for j in target_sample]) & (mb.loss_mask > 0)
        torch.testing.assert_close(packed[mask], per_sample_logprobs(model, s), atol=1e-5, rtol=0)
    # negative control: the same packed call with the KV cache on lets samples attend to each other
    leaky = model(input_ids=mb.input_ids, position_ids=mb.position_ids, attention_mask=None, use_cache=True)
    leaky_lp = token_logprobs(leaky.logits[0, :-1], mb.targets)
    assert (leaky_lp - packed).abs().max() > 1e-3


@pytest.mark.parametrize("attn", ["packed_sdpa", "sdpa"])
def test_step_matches_unsharded_reference_loss_grads_and_sgd_update(tiny_model_dir: str, attn: str) -> None:
    cfg = tiny_config(tiny_model_dir, learning_rate=0.5, grad_clip=1.0)
    samples = make_samples(10, seed=1)
    overlong = make_samples(1, seed=9, min_len=70, max_len=80)  # > seq_len 64: dropped
    backend = backend_for(cfg, optimizer="sgd", attn_implementation=attn)  # with activation checkpointing
    before = weights(backend)
    metrics = step(backend, samples + overlong, cfg)

    ref = plain_model(tiny_model_dir)
    lps = [per_sample_logprobs(ref, s) for s in samples]
    n_tokens = sum(len(lp) for lp in lps)
    # GRPO token_mean over the whole minibatch: -sum(A * logprob) / (loss tokens of all rows)
    loss = -sum(s.advantage * lp.sum() for s, lp in zip(samples, lps, strict=True)) / n_tokens
    loss.backward()
    grads = {n: p.grad for n, p in ref.named_parameters()}
    norm = math.sqrt(sum(float(g.pow(2).sum()) for g in grads.values()))
    coef = min(1.0, cfg.grad_clip / (norm + 1e-6))

    assert metrics["loss"] == pytest.approx(float(loss.detach()), abs=1e-5)
    assert metrics["grad_norm"] == pytest.approx(norm, rel=1e-5)
    assert metrics["loss_tokens"] == n_tokens
    assert metrics["packing/dropped_overlong_samples"] == 1.0
    deltas = [lp.detach() - torch.tensor(s.inference_logprobs) for s, lp in zip(samples, lps, strict=True)]
    k3 = sum(float((d.exp() - 1 - d).sum()) for d in deltas) / n_tokens
    assert metrics["kl_divergence_inference"] == pytest.approx(k3, rel=1e-5)
    after = weights(backend)
    # every HF tensor, tied lm_head.weight once under its first name (embed_tokens)
    assert set(after) == set(ref.state_dict()) - {"lm_head.weight"} and len(after) == 26
    for name, w in after.items():
        expected = before[name] - cfg.learning_rate * coef * grads[name]
        torch.testing.assert_close(w, expected, atol=1e-6, rtol=0)
    assert any((after[n] - before[n]).abs().max() > 1e-4 for n in after)  # parameters changed
    for key in (
        "entropy",
        "learning_rate",
        "timing_optimizer_total",
        "timing_step_total",
        "memory/peak_rss_gb",
    ):
        assert math.isfinite(metrics[key]), key
    # the trainer-side timing_* phases the seed's metrics page names, total and per micro-batch
    for phase in (
        "forward",
        "backward",
        "loss_computation",
        "compute_kl",
        "compute_entropy",
        "data_to_device",
        "prepare_tensors",
    ):
        total, mean = metrics[f"timing_{phase}_total"], metrics[f"timing_{phase}_microbatch_mean"]
        assert total > 0 and mean == pytest.approx(total / metrics["packing/micro_batches_per_rank"]), phase


def test_minibatches_are_optimizer_steps_and_scheduler_steps_once(tiny_model_dir: str) -> None:
    cfg = tiny_config(
        tiny_model_dir,
        number_of_minibatches=3,
        lr_scheduler="linear",
        warmup_steps=2,
        number_of_steps=5,
        learning_rate=1e-3,
    )
    backend = backend_for(cfg, gradient_checkpointing=False)  # AdamW
    lrs = []
    for s in range(5):
        metrics = step(backend, make_samples(9, seed=s), cfg, s)
        assert metrics["train/optimizer_steps"] == 3 and metrics["train/minibatches"] == 3
        lrs.append(metrics["learning_rate"])
    # factors by hand: warmup (s+1)/2 for s<2, then linear from 1 at step 2 to 0 at step 4
    assert lrs == pytest.approx([0.5e-3, 1e-3, 1e-3, 0.5e-3, 0.0])
    opt = backend.state.optimizer
    assert {int(opt.state[p]["step"]) for p in backend.state.model.parameters()} == {15}
    assert backend.state.scheduler.last_epoch == 5


def test_non_finite_grad_norm_skips_the_step(tiny_model_dir: str) -> None:
    cfg = tiny_config(tiny_model_dir)
    backend = backend_for(cfg, optimizer="sgd")
    samples = make_samples(4, seed=2)
    samples[0].advantage = float("nan")
    before = weights(backend)
    metrics = step(backend, samples, cfg)
    assert metrics["train/skipped_nonfinite_steps"] == 1 and metrics["train/optimizer_steps"] == 0
    after = weights(backend)
    for name in before:
        torch.testing.assert_close(after[name], before[name], atol=0, rtol=0)
    metrics = step(backend, make_samples(4, seed=2), cfg)  # next finite step trains again
    assert metrics["train/optimizer_steps"] == 1 and metrics["train/skipped_nonfinite_steps"] == 0


def test_batch_reference_logprobs_pass(tiny_model_dir: str) -> None:
    samples = make_samples(6, seed=4)
    for s in samples:  # rollout logprobs far from the trainer's (~ -log 96): ratio >> 1 + clip_high
        s.inference_logprobs = [-9.0] * len(s.completion_ids)
    rollout_cfg = tiny_config(tiny_model_dir, algorithm="cispo", ppo_clip_ref_logprobs="rollout")
    rollout = step(backend_for(rollout_cfg), samples, rollout_cfg)
    batch_cfg = tiny_config(tiny_model_dir, algorithm="cispo", ppo_clip_ref_logprobs="batch")
    batch = step(backend_for(batch_cfg), samples, batch_cfg)
    assert rollout["clip_high_frac"] == 1.0 and "timing_old_logprobs_total" not in rollout
    # ref = the trainer's own logprobs before the update: ratio exactly 1, nothing clipped
    assert batch["clip_high_frac"] == 0.0 and batch["clip_low_frac"] == 0.0
    assert batch["timing_old_logprobs_total"] > 0


def test_checkpoint_restores_model_optimizer_and_scheduler(tiny_model_dir: str, tmp_path: Any) -> None:
    cfg = tiny_config(tiny_model_dir, lr_scheduler="cosine", number_of_steps=4, learning_rate=1e-2)
    backend = backend_for(cfg, gradient_checkpointing=False)
    step(backend, make_samples(5, seed=0), cfg, 0)
    backend.save_checkpoint(str(tmp_path / "ckpt"))
    saved = weights(backend)
    m1 = step(backend, make_samples(5, seed=1), cfg, 1)
    w1 = weights(backend)
    step(backend, make_samples(5, seed=2), cfg, 2)
    backend.load_checkpoint(str(tmp_path / "ckpt"))
    for name, w in weights(backend).items():
        torch.testing.assert_close(w, saved[name], atol=0, rtol=0)
    again = step(backend, make_samples(5, seed=1), cfg, 1)
    assert again["learning_rate"] == m1["learning_rate"] < cfg.learning_rate
    for name, w in weights(backend).items():  # AdamW moments restored: identical update
        torch.testing.assert_close(w, w1[name], atol=1e-7, rtol=0)
    with pytest.raises(FileNotFoundError, match="not an FSDP checkpoint"):
        backend.load_checkpoint(str(tmp_path))


def test_registered_and_built_from_registry(tiny_model_dir: str) -> None:
    from pydantic import ValidationError

    from telescope.core.plugins import load_plugins
    from telescope.fsdp.backend import FSDPBackend

    _, registry = load_plugins()
    component = registry.get("trainer_backend", "fsdp")
    cfg = tiny_config(tiny_model_dir)
    backend = component.create({"optimizer": "sgd", "gradient_checkpointing": False}, cfg=cfg)
    assert isinstance(backend, FSDPBackend) and backend.kwargs.optimizer == "sgd"
    with pytest.raises(ValidationError):
        component.create({"optimiser": "sgd"}, cfg=cfg)
    with pytest.raises(ValueError, match="temperature > 0"):
        FSDPBackend(tiny_config(tiny_model_dir, temperature=0.0))


def test_step_timer_means_are_per_micro_batch_when_a_phase_has_several_intervals(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import telescope.core.training.timing as timing

    clock = iter([0.0, 1.0, 1.0, 1.5, 2.0, 4.0, 4.0, 4.5])  # start/end pairs: 1.0, 0.5, 2.0, 0.5 s
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(clock))
    timer = timing.StepTimer(torch.device("cpu"))
    timer.num_micro_batches = 2
    for _ in range(2):  # two micro-batches, the loss phase timed in two intervals each
        with timer.track("loss_computation", micro_batch=True):
            pass
        with timer.track("loss_computation", micro_batch=True):
            pass
    metrics = timer.metrics()
    assert metrics["timing_loss_computation_total"] == 4.0
    assert (
        metrics["timing_loss_computation_microbatch_mean"] == 2.0
    )  # 4 s over 2 micro-batches, not 4 intervals


@pytest.mark.parametrize(("option", "forwards"), [(None, 1), (True, 2), (False, 1)])
def test_gradient_checkpointing_auto_is_off_on_cpu(
    tiny_model_dir: str, option: bool | None, forwards: int
) -> None:
    """Each decoder layer runs forward once per micro-batch, twice when its activations are
    recomputed in backward; ``None`` (auto) recomputes only on CUDA."""
    from fsdp_helpers import make_samples

    from telescope.fsdp.model import decoder_layers

    cfg = tiny_config(tiny_model_dir)
    backend = backend_for(cfg, device="cpu", gradient_checkpointing=option)
    calls: list[int] = []
    # a submodule pre-hook: the recompute calls the layer's forward directly (no layer hooks) and
    # stops once the saved tensors are back, before the mlp's forward returns
    decoder_layers(backend.state.model)[0].mlp.register_forward_pre_hook(lambda *_: calls.append(1))
    metrics = step(backend, make_samples(4, seed=1), cfg)
    assert len(calls) == forwards * int(metrics["packing/micro_batches_per_rank"])


@pytest.mark.parametrize("algorithm", ["grpo", "gspo"])
def test_shared_prompt_prefixes_train_exactly_as_one_copy_per_sample(
    tiny_model_dir: str, algorithm: str
) -> None:
    """GRPO groups (3 prompts x 4 completions): with ``share_prompt_prefixes`` each row holds a
    prompt once, and the step's loss, grad norm, metrics and SGD update equal those of the rows
    with one copy per sample (GSPO too: its per-sample sums must still find every sample)."""
    groups = [
        TrainSample(p.prompt_ids, c.completion_ids, c.inference_logprobs, c.advantage)
        for k, p in enumerate(make_samples(3, seed=4, min_len=8))
        for c in make_samples(4, seed=10 + k)
    ]
    cfg = tiny_config(tiny_model_dir, learning_rate=0.5, grad_clip=1.0, algorithm=algorithm, seq_len=512)
    results = {}
    for share in (True, False):
        backend = backend_for(cfg, optimizer="sgd", share_prompt_prefixes=share)
        results[share] = (step(backend, groups, cfg), weights(backend))
    (shared, w_shared), (full, w_full) = results[True], results[False]
    # one row: 3 of each group's 4 prompts are written but their last token
    assert shared["packing/shared_prefix_tokens"] >= sum(3 * (len(s.prompt_ids) - 1) for s in groups[::4]) > 0
    assert full["packing/shared_prefix_tokens"] == 0
    for key in ("loss", "grad_norm", "loss_tokens", "kl_divergence_inference", "entropy"):
        assert shared[key] == pytest.approx(full[key], rel=1e-5, abs=1e-6), key
    for name, w in w_shared.items():
        torch.testing.assert_close(w, w_full[name], atol=1e-6, rtol=0)
