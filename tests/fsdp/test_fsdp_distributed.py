"""Two gloo ranks (torch.multiprocessing spawn) train exactly like one rank on the same batch."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from fsdp_helpers import distributed_worker, make_samples, save_tiny_qwen2, tiny_config, train_and_record  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_rank_group")


def test_two_ranks_equal_one_rank_losses_and_sgd_params(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    from telescope.core.weights.group import free_port

    model_dir = save_tiny_qwen2(tmp_path / "untied", tied=False, seed=5)  # untied: embeddings sharded apart
    cfg = tiny_config(model_dir, number_of_minibatches=2, learning_rate=0.5)
    batches = [make_samples(9, seed=11), make_samples(7, seed=12)]

    single = train_and_record(cfg, batches)
    mp.spawn(
        distributed_worker,
        args=(2, free_port(), cfg.model_dump_json(), batches, str(tmp_path)),
        nprocs=2,
        join=True,
    )
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]

    assert ranks[1]["weights"] == {}  # only rank 0 receives full tensors
    for m1, m2a, m2b in zip(single["metrics"], ranks[0]["metrics"], ranks[1]["metrics"], strict=True):
        assert m2a["packing/micro_batches_per_rank"] * 2 >= m1["packing/micro_batches_per_rank"]
        for key in ("loss", "entropy", "kl_divergence_inference", "grad_norm", "loss_tokens"):
            assert m2a[key] == pytest.approx(m1[key], abs=1e-5), key
            assert m2b[key] == m2a[key], key  # metrics are all-reduced: identical on every rank
        assert m2a["train/optimizer_steps"] == m1["train/optimizer_steps"] == 2
    assert set(ranks[0]["weights"]) == set(single["weights"])
    from transformers import AutoModelForCausalLM

    initial = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    assert set(single["weights"]) == set(initial)
    for name, w in single["weights"].items():
        torch.testing.assert_close(ranks[0]["weights"][name], w, atol=1e-6, rtol=0)
        torch.testing.assert_close(ranks[0]["deferred_sync"]["weights"][name], w, atol=1e-6, rtol=0)
    assert any((w - initial[name]).abs().max() > 1e-4 for name, w in single["weights"].items())  # trained
