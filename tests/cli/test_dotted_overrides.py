"""Dotted overrides (``--environments.0.kwargs.seed 3``) through ``telescope config show``, and
their errors, which name the path."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from telescope.cli.app import app
from telescope.core.config.dotted import apply_overrides

runner = CliRunner()
RUN = {
    "environments": [{"name": "countdown", "kwargs": {"seed": 1, "shuffle": True}}, {"name": "reverse_text"}]
}


def show(tmp_path: Path, *args: str) -> tuple[int, str]:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(RUN))
    result = runner.invoke(app, ["config", "show", str(path), *args])
    return result.exit_code, result.output


def test_sets_a_list_item_and_a_dict_key_and_keeps_the_rest(tmp_path: Path) -> None:
    code, out = show(
        tmp_path,
        "--environments.0.kwargs.seed",
        "3",
        "--train_backend_kwargs.device",
        "cpu",
        "--environments.1.weight=2.5",
    )
    assert code == 0, out
    cfg = yaml.safe_load(out)
    first, second = cfg["environments"]
    assert (
        first["name"] == "countdown" and first["kwargs"]["seed"] == 3 and first["kwargs"]["shuffle"] is True
    )
    assert second["name"] == "reverse_text" and second["weight"] == 2.5
    assert cfg["train_backend_kwargs"] == {"device": "cpu"}


def test_values_are_yaml_and_sources_name_the_cli(tmp_path: Path) -> None:
    code, out = show(tmp_path, "--sources", "--environments.1.kwargs", "{seed: 7}")
    assert code == 0, out
    line = next(x for x in out.splitlines() if x.startswith("environments:"))
    assert "seed: 7" in line and line.endswith("# cli")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--environments.2.kwargs.seed", "3"], "index 2 is out of range: environments has 2 item(s)"),
        (["--environments.first.name", "x"], "environments is a list, so 'first' must be an index"),
        (["--learning_rate.x", "1"], "learning_rate is 1e-06 (float), not a dict or list, so it has no 'x'"),
        (["--environments.0.name.x", "1"], "environments.0.name is 'countdown' (str), not a dict or list"),
        (["--environmentz.0.name", "x"], "override --environmentz.0.name: unknown field"),
    ],
)
def test_errors_name_the_path(tmp_path: Path, args: list[str], message: str) -> None:
    code, out = show(tmp_path, *args)
    assert code == 2 and message in " ".join(out.split()), out


def test_applied_in_order_without_touching_the_base() -> None:
    base = {"a": [{"b": 1}], "c": None}
    got = apply_overrides(base, {"a": [{"b": 2}, {"b": 3}], "a.1.b": 4, "c.d.e": "x"})
    assert got == {"a": [{"b": 2}, {"b": 4}], "c": {"d": {"e": "x"}}}
    assert base == {"a": [{"b": 1}], "c": None}
