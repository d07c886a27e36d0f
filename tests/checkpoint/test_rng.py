"""RNG states: python, numpy and torch draws repeat exactly after a restore."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from telescope.core.checkpoint.rng import load_rng_states, save_rng_states  # noqa: E402


def draws() -> tuple[Any, ...]:
    return (random.random(), random.randrange(10**9), np.random.rand(3).tolist(), torch.rand(4).tolist())


def test_saved_states_replay_the_same_draws(tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    draws()  # some history before the save
    save_rng_states(tmp_path, 1, extra={"tracker": {"a": 7}})
    expected = draws()
    draws()  # the run goes on
    assert draws() != expected
    extra = load_rng_states(tmp_path, 1)
    assert draws() == expected
    assert extra == {"tracker": {"a": 7}}
    assert (tmp_path / "rng_rank_1.pt").is_file()


def test_missing_rank_file_leaves_rng_alone(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(5)
    state = torch.get_rng_state()
    assert load_rng_states(tmp_path, 3) is None
    assert torch.equal(torch.get_rng_state(), state)
    assert "rng_rank_3.pt is missing" in caplog.text


class _RunsCode:
    """A pickle payload that runs a shell command when unpickled (what a crafted checkpoint carries)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        import os

        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_rng_file_cannot_run_code(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    torch.save({"python": random.getstate(), "extra": {"x": _RunsCode(marker)}}, tmp_path / "rng_rank_0.pt")
    with pytest.raises(Exception, match="Weights only load failed"):
        load_rng_states(tmp_path, 0)
    assert not marker.exists()


def test_an_older_release_rng_file_with_numpy_arrays_still_loads(tmp_path: Path) -> None:
    """Files written before the numpy state became a tensor pickled numpy's own tuple."""
    np.random.seed(11)
    torch.save(
        {"python": random.getstate(), "numpy": np.random.get_state(), "extra": {}}, tmp_path / "rng_rank_0.pt"
    )
    expected = np.random.rand(3).tolist()
    np.random.seed(99)
    assert load_rng_states(tmp_path, 0) == {}
    assert np.random.rand(3).tolist() == expected


def test_a_crafted_trainer_state_cannot_run_code(tmp_path: Path) -> None:
    from telescope.core.checkpoint.layout import read_trainer_state

    marker = tmp_path / "pwned"
    torch.save({"step": 3, "counters": {}, "scheduler": _RunsCode(marker)}, tmp_path / "trainer_state.pt")
    with pytest.raises(ValueError, match="trainer_state.pt holds more than tensors and plain data"):
        read_trainer_state(tmp_path)
    assert not marker.exists()
    torch.save(
        {"step": 3, "counters": {"samples": 12}, "scheduler": {"last_epoch": 3, "base_lrs": [1e-3]}},
        tmp_path / "trainer_state.pt",
    )
    assert read_trainer_state(tmp_path)["counters"] == {"samples": 12}
