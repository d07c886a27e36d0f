"""FSDP checkpoints on one gloo rank: exact resume (weights, AdamW, warmup+cosine LR, RNG),
weights-only checkpoints, and crashes in the middle of a save."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from ckpt_helpers import make_backend, resume_config, run_steps, weights  # noqa: E402

from telescope.core.checkpoint import CheckpointManager  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_rank_group")


def expected_lr(cfg: Any, step: int) -> float:
    """Warmup then cosine, written out independently of telescope.core.training.schedules."""
    import math

    if step < cfg.warmup_steps:
        return cfg.learning_rate * (step + 1) / cfg.warmup_steps
    p = min((step - cfg.warmup_steps) / (cfg.number_of_steps - 1 - cfg.warmup_steps), 1.0)
    return cfg.learning_rate * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


def commit_save(backend: Any, mgr: CheckpointManager, step: int, training_state: bool = True) -> Path:
    partial = mgr.begin(step)
    backend.save_checkpoint(str(partial), training_state=training_state)
    return mgr.commit(partial, step, meta={"backend": "fsdp"})


@pytest.fixture(scope="module")
def uninterrupted(untied_model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Six steps in one go, with a full and a weights-only checkpoint after step 3."""
    cfg = resume_config(untied_model_dir)
    backend = make_backend(cfg)
    mgr = CheckpointManager(tmp_path_factory.mktemp("ckpts"))
    first = run_steps(backend, cfg, range(0, 3))
    full = commit_save(backend, mgr, 3)
    light = Path(str(tmp_path_factory.mktemp("weights_only")))
    backend.save_checkpoint(str(light), training_state=False)
    saved = weights(backend)
    rest = run_steps(backend, cfg, range(3, 6))
    return {
        "cfg": cfg,
        "metrics": first + rest,
        "final": weights(backend),
        "saved": saved,
        "full": full,
        "light": light,
        "mgr": mgr,
    }


def test_resume_in_a_fresh_trainer_repeats_the_uninterrupted_run(uninterrupted: dict[str, Any]) -> None:
    cfg = uninterrupted["cfg"]
    lrs = [m["learning_rate"] for m in uninterrupted["metrics"]]
    assert lrs == pytest.approx([expected_lr(cfg, s) for s in range(6)], rel=1e-12)
    assert len(set(lrs)) >= 5  # warmup and decay: the LR really changes step to step
    resumed = make_backend(cfg)
    info = resumed.load_checkpoint(str(uninterrupted["full"]))
    assert info == {"step": 3, "training_state": True}
    for name, w in weights(resumed).items():
        torch.testing.assert_close(w, uninterrupted["saved"][name], atol=0, rtol=0)
    again = run_steps(resumed, cfg, range(3, 6))
    for m_again, m_orig in zip(again, uninterrupted["metrics"][3:], strict=True):
        assert m_again["learning_rate"] == m_orig["learning_rate"]  # the scheduler was restored
        assert m_again["loss"] == pytest.approx(m_orig["loss"], abs=1e-6)
        assert m_again["grad_norm"] == pytest.approx(m_orig["grad_norm"], abs=1e-6)
    for name, w in weights(resumed).items():  # AdamW moments restored: identical updates
        torch.testing.assert_close(w, uninterrupted["final"][name], atol=1e-6, rtol=0)


def test_checkpoint_files(uninterrupted: dict[str, Any], untied_model_dir: str) -> None:
    full, light = uninterrupted["full"], uninterrupted["light"]
    names = {p.name for p in full.iterdir()}
    assert {
        ".metadata",
        "trainer_state.pt",
        "trainer_meta.json",
        "rng_rank_0.pt",
        "hf_meta",
        "meta.json",
    } <= names
    assert (full / "hf_meta" / "config.json").read_bytes() == (
        Path(untied_model_dir) / "config.json"
    ).read_bytes()
    meta = json.loads((full / "trainer_meta.json").read_text())
    assert meta["backend"] == "fsdp" and meta["step"] == 3 and meta["training_state"] is True
    from torch.distributed.checkpoint import FileSystemReader

    def keys(path: Path) -> set[str]:
        return set(FileSystemReader(str(path)).read_metadata().state_dict_metadata)

    assert any(k.startswith("optimizer.") for k in keys(full))
    assert "model.model.embed_tokens.weight" in keys(full) and "model.lm_head.weight" in keys(full)
    assert not any(k.startswith("optimizer.") for k in keys(light))
    assert "scheduler" not in torch.load(light / "trainer_state.pt", weights_only=False)


def test_rng_states_come_back(uninterrupted: dict[str, Any], tmp_path: Path) -> None:
    import numpy as np

    backend = make_backend(uninterrupted["cfg"])
    backend.save_checkpoint(str(tmp_path))
    expected = (random.random(), np.random.rand(2).tolist(), torch.rand(3).tolist())
    _ = torch.rand(100), random.random(), np.random.rand(5)  # the run consumes randomness
    backend.load_checkpoint(str(tmp_path))
    assert (random.random(), np.random.rand(2).tolist(), torch.rand(3).tolist()) == expected


def test_weights_only_checkpoint_resumes_with_fresh_optimizer_and_the_right_lr(
    uninterrupted: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    cfg = uninterrupted["cfg"]
    backend = make_backend(cfg)
    run_steps(backend, cfg, range(0, 1))  # optimizer state that must not survive the load
    with caplog.at_level("WARNING"):
        info = backend.load_checkpoint(str(uninterrupted["light"]))
    assert info == {"step": 3, "training_state": False}
    assert "weights-only checkpoint" in caplog.text
    assert len(backend.state.optimizer.state) == 0
    for name, w in weights(backend).items():
        torch.testing.assert_close(w, uninterrupted["saved"][name], atol=0, rtol=0)
    (m,) = run_steps(backend, cfg, range(3, 4))
    assert m["learning_rate"] == uninterrupted["metrics"][3]["learning_rate"]
    # same weights, same LR, but AdamW starts over: the first update differs from the resumed run's
    assert m["loss"] == pytest.approx(uninterrupted["metrics"][3]["loss"], abs=1e-6)
    assert any((w - uninterrupted["final"][k]).abs().max() > 1e-6 for k, w in weights(backend).items())


def test_weights_only_load_leaves_schedule_and_optimizer_alone(uninterrupted: dict[str, Any]) -> None:
    cfg = uninterrupted["cfg"]
    backend = make_backend(cfg)
    info = backend.load_checkpoint(str(uninterrupted["full"]), training_state=False)
    assert info == {"step": 3, "training_state": False}
    for name, w in weights(backend).items():
        torch.testing.assert_close(w, uninterrupted["saved"][name], atol=0, rtol=0)
    (m,) = run_steps(backend, cfg, range(0, 1))
    assert m["learning_rate"] == expected_lr(cfg, 0)  # schedule not moved


def test_crash_inside_the_trainer_save_keeps_the_previous_checkpoint(
    uninterrupted: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = uninterrupted["cfg"]
    mgr = CheckpointManager(tmp_path, keep_last=1)
    backend = make_backend(cfg)
    run_steps(backend, cfg, range(0, 3))
    good = commit_save(backend, mgr, 3)
    run_steps(backend, cfg, range(3, 4))
    real_save = torch.save

    def disk_full(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if str(f).endswith("trainer_state.pt"):
            raise OSError(28, "No space left on device")
        real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", disk_full)
    partial = mgr.begin(4)
    with pytest.raises(OSError, match="No space left"):
        backend.save_checkpoint(str(partial))
    monkeypatch.setattr(torch, "save", real_save)
    assert mgr.steps() == [3]  # the half-written step 4 is invisible; retention did not run
    mgr.abort(partial)
    # crash after the trainer wrote everything but before commit: still invisible
    crashed = mgr.begin(4)
    backend.save_checkpoint(str(crashed))
    assert mgr.steps() == [3] and mgr.resolve(True) == good
    assert CheckpointManager(tmp_path).cleanup_partials() == 1 and not crashed.exists()
    fresh = make_backend(cfg)
    assert fresh.load_checkpoint(str(mgr.resolve(True)))["step"] == 3
    for name, w in weights(fresh).items():
        torch.testing.assert_close(w, uninterrupted["saved"][name], atol=0, rtol=0)


def test_load_rejects_folders_that_are_not_fsdp_checkpoints(
    uninterrupted: dict[str, Any], tmp_path: Path
) -> None:
    backend = make_backend(uninterrupted["cfg"])
    with pytest.raises(FileNotFoundError, match="not an FSDP checkpoint"):
        backend.load_checkpoint(str(tmp_path))


def test_tied_embeddings_are_stored_once_and_resume_exactly(builtin_tiny_dir: str, tmp_path: Path) -> None:
    from telescope.fsdp.checkpoint import tied_aliases

    cfg = resume_config(builtin_tiny_dir)
    backend = make_backend(cfg)
    assert tied_aliases(backend.state.model) == {"lm_head.weight": "model.embed_tokens.weight"}
    run_steps(backend, cfg, range(0, 2))
    backend.save_checkpoint(str(tmp_path))
    saved = weights(backend)
    (expected,) = run_steps(backend, cfg, range(2, 3))
    resumed = make_backend(cfg)
    resumed.load_checkpoint(str(tmp_path))
    model = resumed.state.model
    assert model.lm_head.weight is model.model.embed_tokens.weight  # still one tensor after the load
    for name, w in weights(resumed).items():
        torch.testing.assert_close(w, saved[name], atol=0, rtol=0)
    (again,) = run_steps(resumed, cfg, range(2, 3))
    assert again["loss"] == pytest.approx(expected["loss"], abs=1e-6)
    assert again["learning_rate"] == expected["learning_rate"]


def test_resume_at_a_lower_learning_rate_trains_at_it(uninterrupted: dict[str, Any]) -> None:
    """A health rollback restores a checkpoint with learning_rate lowered: the restored scheduler
    keeps this run's base LR, not the checkpoint's (AdamW moments still come back)."""
    cfg = uninterrupted["cfg"]
    lowered = cfg.model_copy(update={"learning_rate": cfg.learning_rate / 4})
    backend = make_backend(lowered)
    assert backend.load_checkpoint(str(uninterrupted["full"])) == {"step": 3, "training_state": True}
    assert len(backend.state.optimizer.state) > 0
    (m,) = run_steps(backend, lowered, range(3, 4))
    assert m["learning_rate"] == pytest.approx(expected_lr(cfg, 3) / 4, rel=1e-12)
