"""Three layers, override parsing, sources, and schema-level error messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from telescope.core.config import ConfigError, field_names, load_config, load_config_with_sources
from telescope.core.config.loader import parse_overrides, parse_yaml_value

ENV = {"environments": [{"name": "x"}]}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_layers_later_wins_and_sources(tmp_path: Path) -> None:
    path = write(tmp_path, "environments: [{name: x}]\nlearning_rate: 1.0e-5\ngroup_size: 4\n")
    cfg, layers = load_config_with_sources(path, ["--learning_rate", "5e-7"])
    assert cfg.learning_rate == 5e-7 and cfg.group_size == 4 and cfg.seq_len == 4096
    assert layers.sources["learning_rate"] == "cli"
    assert layers.sources["group_size"] == str(path)
    assert layers.sources["seq_len"] == "defaults"
    assert layers.user_keys == {"environments", "learning_rate", "group_size"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("5e-7", 5e-7),
        ("1.0e-6", 1e-6),
        ("-3", -3),
        ("true", True),
        ("null", None),
        ("[a, b]", ["a", "b"]),
        ('["a","b"]', ["a", "b"]),
        ("{name: countdown, weight: 2}", {"name": "countdown", "weight": 2}),
        ("hello", "hello"),
    ],
)
def test_override_values_parse_as_yaml(text: str, expected: object) -> None:
    assert parse_yaml_value(text) == expected


def test_override_forms() -> None:
    names = field_names()
    assert parse_overrides(["--learning-rate=5e-7", "--wandb_tags", "[a,b]"], names) == {
        "learning_rate": 5e-7,
        "wandb_tags": ["a", "b"],
    }


def test_lists_and_dicts_from_cli() -> None:
    cfg = load_config(
        None,
        [
            "--environments",
            "[{name: a, weight: 2.0, kwargs: {n: 3}}, {name: b}]",
            "--ray_runtime_env",
            "{pip: [x]}",
        ],
    )
    assert [e.name for e in cfg.environments] == ["a", "b"]
    assert cfg.environments[0].kwargs == {"n": 3}
    assert cfg.ray_runtime_env == {"pip": ["x"]}


def test_list_replaced_not_merged(tmp_path: Path) -> None:
    path = write(tmp_path, "environments: [{name: a}, {name: b}]\n")
    cfg = load_config(path, ["--environments", "[{name: c}]"])
    assert [e.name for e in cfg.environments] == ["c"]


def test_unknown_key_suggestion(tmp_path: Path) -> None:
    path = write(tmp_path, "environments: [{name: x}]\nlearnig_rate: 0.1\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "learnig_rate" in str(err.value) and "Did you mean 'learning_rate'" in str(err.value)


def test_nested_unknown_key_suggestion() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, {"environments": [{"name": "x", "wieght": 2}]})
    assert "environments[0].wieght" in str(err.value) and "'weight'" in str(err.value)


def test_type_errors_name_field_and_value() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, {**ENV, "group_size": "eight", "clip_low": 1.5})
    text = str(err.value)
    assert "group_size" in text and "'eight'" in text
    assert "clip_low" in text and "1.5" in text
    assert len(err.value.problems) == 2


def test_checkpoint_and_resume_unions() -> None:
    assert load_config(None, {**ENV, "checkpoint_every": 10}).checkpoint_every == 10
    assert load_config(None, {**ENV, "checkpoint_every": False}).checkpoint_every is False
    assert load_config(None, {**ENV, "resume_from_checkpoint": True}).resume_from_checkpoint is True
    assert load_config(None, {**ENV, "resume_from_checkpoint": 40}).resume_from_checkpoint == 40
    with pytest.raises(ConfigError, match="checkpoint_every"):
        load_config(None, {**ENV, "checkpoint_every": True})


def test_run_dir_default_follows_run_name() -> None:
    assert load_config(None, {**ENV, "wandb_run_name": "abc"}).resolved_run_dir == "runs/abc"
    assert load_config(None, {**ENV, "run_dir": "/tmp/r"}).resolved_run_dir == "/tmp/r"
