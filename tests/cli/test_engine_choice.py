"""Engine choice at startup: auto on a CUDA machine without vLLM refuses with the install command,
the summary names the engine and why, tracing needs its packages, and no message loses '[vllm]'.

CUDA and vLLM are not here: ``_cuda_available`` / ``_importable`` are replaced by fakes, and
the runtime's ``run_training`` by a fake that records it was called.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import telescope.core.inference.auto as auto
from telescope.cli.app import app
from telescope.core.config import ConfigError
from telescope.core.inference.vllm_engine.args import otlp_endpoint

runner = CliRunner()
INSTALL = "pip install 'telescope-core[vllm]'"


def make_cfg(**fields: object):  # type: ignore[no-untyped-def]
    from telescope.core.testing import make_config

    return make_config(**fields)


def _run_yaml(tmp_path: Path, **fields: object) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"environments": [{"name": "reverse_text"}], **fields}))
    return str(path)


@pytest.fixture
def fake_runtime(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Fake ``run_training``: records the engine it was asked to run, trains nothing."""
    import telescope.core.runtime as runtime

    calls: list[str] = []
    monkeypatch.setattr(
        runtime, "run_training", lambda cfg, pset, registry: calls.append(cfg.inference_engine) or 0
    )
    return calls


def _no_vllm(monkeypatch: pytest.MonkeyPatch, *, gpu: bool) -> None:
    real = auto._importable
    monkeypatch.setattr(auto, "_importable", lambda m: False if m == "vllm" else real(m))
    monkeypatch.setattr(auto, "_cuda_available", lambda: gpu)


@pytest.mark.parametrize(
    ("gpu", "fields", "code", "expected", "ran"),
    [
        # auto on a CUDA machine without vLLM: refused before anything starts.
        (True, {}, 2, [INSTALL, "set inference_engine: transformers"], []),
        # The explicit fallback runs, and the summary says which engine and why.
        (
            True,
            {"inference_engine": "transformers"},
            0,
            ["engine transformers (inference_engine: transformers (set in the config))"],
            ["transformers"],
        ),
        (
            False,
            {},
            0,
            [
                "engine transformers (inference_engine: auto chose transformers (no CUDA GPU and vllm is not installed))"
            ],
            ["auto"],
        ),  # the runtime resolves auto again, on the same machine
    ],
    ids=["auto-gpu-refused", "explicit-fallback", "auto-cpu"],
)
def test_engine_choice_at_startup(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fake_runtime: list[str],
    gpu: bool,
    fields: dict[str, str],
    code: int,
    expected: list[str],
    ran: list[str],
) -> None:
    _no_vllm(monkeypatch, gpu=gpu)
    result = runner.invoke(app, ["train", _run_yaml(tmp_path, **fields)])
    assert result.exit_code == code, result.output
    text = " ".join(result.output.split())
    assert all(e in text for e in expected), text
    assert fake_runtime == ran


def test_resolution_raises_a_config_error_for_auto_on_gpu_without_vllm() -> None:
    with pytest.raises(ConfigError, match=r"telescope-core\[vllm\]"):
        auto.resolve_inference_engine("auto", has_vllm=lambda: False, has_gpu=lambda: True)


def test_config_validate_keeps_the_extra_in_brackets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rich markup used to swallow '[vllm]': "pip install 'telescope-core' on a CUDA machine"."""
    from telescope.core.plugins import load_plugins

    _, registry = load_plugins()
    if registry.get("inference_engine", "vllm").available:
        pytest.skip("vllm is installed here: selecting it is no error")
    result = runner.invoke(app, ["config", "validate", _run_yaml(tmp_path, inference_engine="vllm")])
    assert result.exit_code == 2
    assert INSTALL in " ".join(result.output.split())


def test_user_errors_print_brackets_verbatim(tmp_path: Path) -> None:
    """Any message: a config error quoting '[bold]' and '[/]' is printed as is."""
    result = runner.invoke(app, ["config", "validate", _run_yaml(tmp_path, wandb_run_name=["[bold]x[/]"])])
    assert result.exit_code == 2 and "[bold]x[/]" in result.output


def test_tracing_is_dropped_with_a_warning_without_its_packages(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = make_cfg(enable_vllm_tracing=True, otlp_receiver_port=4999)
    real = auto._importable
    # the dev venv has the http exporter but not the grpc one (telescope-core[vllm] brings both)
    with monkeypatch.context() as patch:
        patch.setattr(auto, "_importable", lambda m: True if m.startswith("opentelemetry.") else real(m))
        assert otlp_endpoint(cfg, "10.1.2.3") == "http://10.1.2.3:4999/v1/traces"
    assert otlp_endpoint(make_cfg(enable_vllm_tracing=False), "10.1.2.3") is None
    monkeypatch.setattr(
        auto, "_importable", lambda m: False if m.startswith("opentelemetry.exporter") else real(m)
    )
    with caplog.at_level("WARNING", logger="telescope.inference"):
        assert otlp_endpoint(cfg, "10.1.2.3") is None
    assert "tracing disabled" in caplog.text and INSTALL in caplog.text
    assert any("enable_vllm_tracing: tracing disabled" in n for n in auto.startup_notes(cfg, "vllm"))
    assert not any("tracing" in n for n in auto.startup_notes(cfg, "transformers"))


def test_a_runtime_that_fails_to_import_is_reported_with_its_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    _no_vllm(monkeypatch, gpu=False)
    monkeypatch.setitem(sys.modules, "telescope.core.runtime", None)  # its import raises ModuleNotFoundError
    result = runner.invoke(app, ["train", _run_yaml(tmp_path)])
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    assert "training failed: ModuleNotFoundError" in text and "telescope.core.runtime" in text, text
    assert "not part of this release" not in text
