"""hf_meta/: the base model's config, generation config and tokenizer, copied or re-saved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from telescope.core.checkpoint.hf_meta import _save_from_hub, write_hf_meta


def test_local_folder_is_copied_byte_for_byte_without_weights(builtin_tiny_dir: str, tmp_path: Path) -> None:
    out = write_hf_meta(builtin_tiny_dir, tmp_path / "hf_meta")
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    for name in names:
        assert (out / name).read_bytes() == (Path(builtin_tiny_dir) / name).read_bytes()


def test_builtin_name_resolves_to_its_folder(builtin_tiny_dir: str, tmp_path: Path) -> None:
    out = write_hf_meta("telescope/tiny", tmp_path / "hf_meta")
    assert (out / "config.json").read_bytes() == (Path(builtin_tiny_dir) / "config.json").read_bytes()


def test_transformers_path_used_for_hub_ids(builtin_tiny_dir: str, tmp_path: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    _save_from_hub(builtin_tiny_dir, tmp_path)  # same calls a hub id takes (from the local cache)
    saved, original = (AutoConfig.from_pretrained(p).to_dict() for p in (tmp_path, builtin_tiny_dir))
    saved.pop("_name_or_path"), original.pop("_name_or_path")
    assert saved == original
    text = "a short test"
    assert AutoTokenizer.from_pretrained(tmp_path)(text) == AutoTokenizer.from_pretrained(builtin_tiny_dir)(
        text
    )
    assert json.loads((tmp_path / "generation_config.json").read_text())


def test_folder_without_config_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        write_hf_meta(str(tmp_path / "model"), tmp_path / "out")
