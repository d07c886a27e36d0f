"""``telescope eval`` end to end: HF folders and a native checkpoint, real servers (the transformers engine,
and real vLLM, its CPU build: ``vllm_cpu``, ``make test-vllm-cpu``), results files."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from telescope.cli.commands.eval import eval_command
from telescope.cli.options import CONTEXT
from telescope.core.config import ConfigError
from telescope.core.evals.standalone import discover_checkpoints
from telescope.core.evals.standalone_config import EvalRunConfig, load_eval_run_config, training_config

DATA = Path(__file__).parent / "data"


def cli() -> typer.Typer:
    app = typer.Typer()
    app.command("eval", context_settings=CONTEXT)(eval_command)
    app.command("noop")(lambda: None)  # two commands: typer keeps the "eval" name
    return app


@pytest.fixture(scope="module")
def native_checkpoint(tiny_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A committed FSDP checkpoint of the untrained tiny model (same weights as the HF folder)."""
    pytest.importorskip("telescope.fsdp")
    sys.path.insert(0, str(Path(__file__).parents[1] / "fsdp"))
    sys.path.insert(0, str(Path(__file__).parents[1] / "checkpoint"))
    from ckpt_helpers import make_backend, resume_config

    from telescope.core.checkpoint import CheckpointManager

    mgr = CheckpointManager(tmp_path_factory.mktemp("native") / "checkpoints")
    backend = make_backend(resume_config(tiny_path))
    partial = mgr.begin(4)
    backend.save_checkpoint(str(partial))
    yield mgr.commit(partial, 4)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def write_yaml(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


# A vLLM server takes minutes to start on 2 cores (one per checkpoint).
STARTUP_TIMEOUT_S = {"transformers": 120, "vllm": 900}


@pytest.mark.parametrize(
    "engine", ["transformers", pytest.param("vllm", marks=[pytest.mark.vllm_cpu, pytest.mark.timeout(1800)])]
)
def test_eval_yaml_end_to_end(engine: str, tiny_path: str, native_checkpoint: Path, tmp_path: Path) -> None:
    from telescope.core.weights.group import free_port

    ckpts = tmp_path / "run" / "checkpoints"
    shutil.copytree(tiny_path, ckpts / "step_2")  # an HF folder discovered in checkpoint_dir
    (ckpts / "step_9").mkdir()  # incomplete: neither HF nor committed, skipped
    evals = [
        {"name": "reverse_text", "num_samples": 3, "pass_k": [1, 2], "max_tokens": 5},
        {"name": "math500", "num_samples": 2, "kwargs": {"data_files": str(DATA / "math500.jsonl")}},
    ]
    spec = write_yaml(
        tmp_path / "eval.yaml",
        {
            "checkpoint_dir": str(ckpts),
            "checkpoints": [{"path": str(native_checkpoint), "step": 4}],
            "evals": evals,
            "max_tokens": 4,
            "max_model_len": 256,
            "inference_engine": "transformers",  # the command line picks the engine
            "inference_base_port": free_port(),
            "max_concurrent_prompts_per_server": 4,
            "seed": 5,
        },
    )
    result = CliRunner().invoke(
        cli(),
        [
            "eval",
            str(spec),
            "--inference_engine",
            engine,
            "--inference_engine_kwargs",
            f"{{startup_timeout_s: {STARTUP_TIMEOUT_S[engine]}}}",
        ],
    )
    assert result.exit_code == 0, result.output
    server_logs = sorted((tmp_path / "run" / "logs" / "eval_inference").glob("step_*/server_0.log"))
    assert [p.parent.name for p in server_logs] == ["step_2", "step_4"]  # one server per checkpoint
    assert all(("LLM engine (v" in p.read_text()) == (engine == "vllm") for p in server_logs)
    out = tmp_path / "run" / "evals"  # run_dir defaults to the parent of checkpoint_dir
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["name"]) for r in lines] == [
        (2, "reverse_text"),
        (2, "math500"),
        (4, "reverse_text"),
        (4, "math500"),
    ]
    for r in lines:
        assert r["metrics"]["errors"] == 0 and r["metrics"]["num_samples"] in (2, 3)
    rev = [r["metrics"] for r in lines if r["name"] == "reverse_text"]
    assert all(m["num_completions"] == 6 and 0 <= m["pass@2/reward"] <= 1 for m in rev)
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 * (3 + 2)
    by_step = {s: [x for x in samples if x["step"] == s] for s in (2, 4)}
    # The native checkpoint holds the same weights: converted, it samples exactly what the HF folder did.
    assert [x["completions"] for x in by_step[4]] == [x["completions"] for x in by_step[2]]
    assert all(n <= 5 for x in by_step[2] if x["name"] == "reverse_text" for n in x["completion_tokens"])
    assert all(n <= 4 for x in by_step[2] if x["name"] == "math500" for n in x["completion_tokens"])
    assert not list(native_checkpoint.parent.glob("*hf*"))  # the converted copy lived in a temp dir


def test_config_is_short_and_errors_are_clear(tmp_path: Path, tiny_path: str) -> None:
    run = load_eval_run_config(
        write_yaml(tmp_path / "a.yaml", {"model": tiny_path, "evals": [{"name": "math500"}]})
    )
    assert run.inference_engine == "auto" and run.inference_num_workers == 1 and not run.use_wandb
    assert [(c.path, c.step) for c in discover_checkpoints(run)] == [(tiny_path, 0)]
    half = load_eval_run_config(tmp_path / "a.yaml", {"model_dtype": "bfloat16"})
    assert training_config(half, tiny_path, "transformers").model_dtype == "bfloat16"  # reaches the servers
    assert training_config(run, tiny_path, "transformers").model_dtype == "float32"
    with pytest.raises(ConfigError, match="nothing to evaluate"):
        load_eval_run_config(write_yaml(tmp_path / "b.yaml", {"evals": [{"name": "math500"}]}))
    with pytest.raises(ConfigError, match="evals\\[0\\].pass_k.at_k.k: k values must be integers >= 1"):
        load_eval_run_config(
            write_yaml(tmp_path / "c.yaml", {"model": "m", "evals": [{"name": "x", "pass_k": {"at_k": [0]}}]})
        )
    with pytest.raises(ConfigError, match="wandb_run_path must be entity/project/run_id"):
        load_eval_run_config(tmp_path / "a.yaml", {"wandb_run_path": "p/r"})
    with pytest.raises(ValueError, match="use_wandb"):
        EvalRunConfig.model_validate({"model": "m", "evals": [{"name": "x"}], "use_wandb": "yes please"})
    result = CliRunner().invoke(
        cli(),
        ["eval", str(write_yaml(tmp_path / "d.yaml", {"model": tiny_path, "evals": [{"name": "math5000"}]}))],
    )
    assert result.exit_code == 2 and "unknown eval 'math5000'" in result.output and "math500" in result.output
    empty = tmp_path / "empty"
    empty.mkdir()
    result = CliRunner().invoke(
        cli(),
        [
            "eval",
            str(
                write_yaml(
                    tmp_path / "e.yaml", {"checkpoint_dir": str(empty), "evals": [{"name": "math500"}]}
                )
            ),
        ],
    )
    assert result.exit_code == 2 and "holds no complete step_<N> checkpoint" in result.output


def test_wandb_sink_logs_eval_metrics_on_an_eval_step_axis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb")
    from telescope.core.evals import EvalResult
    from telescope.core.evals.standalone import WandbEvalSink

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = EvalRunConfig.model_validate(
        {"model": "m", "evals": [{"name": "x"}], "use_wandb": True, "run_dir": str(tmp_path)}
    )
    sink = WandbEvalSink(run)
    try:
        sink.log(7, [EvalResult("math500", 7, {"correct": 0.25, "pass@4/correct": 0.5})])
        summary = dict(sink.run.summary)
    finally:
        sink.finish()
    assert summary["eval/step"] == 7
    assert summary["eval/math500/correct"] == 0.25 and summary["eval/math500/pass@4/correct"] == 0.5
    assert list(tmp_path.glob("wandb/offline-run-*"))


def test_the_example_eval_yaml_validates() -> None:
    from telescope.core.evals.standalone_config import check_eval_names
    from telescope.core.plugins import load_plugins

    run = load_eval_run_config(Path(__file__).resolve().parents[2] / "examples" / "eval" / "eval.yaml")
    check_eval_names(run, load_plugins()[1])
    assert [e.pass_k.max_k for e in run.evals] == [4, 8, 1]
