"""Checkpoint conversion per backend is registered by the backend's own package; core only drives it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from telescope.core.checkpoint.convert import backend_converter, convert_checkpoint
from telescope.core.plugins import load_plugins


def test_each_backend_package_registers_its_converter() -> None:
    import telescope.fsdp.convert
    import telescope.megatron.convert

    _, registry = load_plugins()
    assert backend_converter("fsdp", registry) is telescope.fsdp.convert.write_hf_weights
    assert backend_converter("megatron", registry) is telescope.megatron.convert.write_hf_weights


def test_a_backend_without_a_converter_is_not_implemented(tmp_path: Path) -> None:
    src = tmp_path / "step_1"
    src.mkdir()
    (src / "trainer_meta.json").write_text(json.dumps({"backend": "someone_elses"}))
    with pytest.raises(
        NotImplementedError, match="trainer backend 'someone_elses'.*registers no checkpoint_converter"
    ):
        convert_checkpoint(src, tmp_path / "out")
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["step_1"]
