"""Two gloo ranks: a checkpoint saved by both resumes exactly, restores each rank's RNG, and
loads into a one-rank trainer (DCP reshards)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from ckpt_helpers import make_backend, resume_config, two_rank_resume_worker, weights  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_rank_group")


def test_two_rank_save_resume_and_reshard_to_one_rank(untied_model_dir: str, tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    from telescope.core.weights.group import free_port

    cfg = resume_config(untied_model_dir, number_of_steps=4, warmup_steps=1)
    mp.spawn(
        two_rank_resume_worker,
        args=(2, free_port(), cfg.model_dump_json(), str(tmp_path)),
        nprocs=2,
        join=True,
    )
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    ckpt = tmp_path / "ckpts" / "step_2"
    assert {p.name for p in ckpt.glob("*.distcp")} == {"__0_0.distcp", "__1_0.distcp"}
    assert (ckpt / "rng_rank_0.pt").is_file() and (ckpt / "rng_rank_1.pt").is_file()
    for r in ranks:
        assert r["info"] == {"step": 2, "training_state": True}
        assert torch.equal(r["rand_load"], r["rand_save"])  # each rank's own stream
        for m_again, m_orig in zip(r["again"], r["metrics"][2:], strict=True):
            assert m_again["learning_rate"] == m_orig["learning_rate"]
            assert m_again["loss"] == pytest.approx(m_orig["loss"], abs=1e-6)
    assert not torch.equal(ranks[0]["rand_save"], ranks[1]["rand_save"])
    assert ranks[1]["final"] == {}  # only rank 0 gathers full tensors
    for name, w in ranks[0]["final_again"].items():
        torch.testing.assert_close(w, ranks[0]["final"][name], atol=1e-6, rtol=0)

    one = make_backend(cfg)  # the same checkpoint on one rank
    assert one.load_checkpoint(str(ckpt), training_state=False)["step"] == 2
    for name, w in weights(one).items():
        torch.testing.assert_close(w, ranks[0]["saved"][name], atol=0, rtol=0)
