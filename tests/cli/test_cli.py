"""The telescope command: version, plugins, config show/validate, train, and 35+ bad configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from telescope.cli.app import app

runner = CliRunner()
GOOD = {"environments": [{"name": "reverse_text"}]}


def write(tmp_path: Path, data: object, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def invoke(*args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, list(args))


def test_version() -> None:
    result = invoke("--version")
    assert result.exit_code == 0 and "telescope-core 0.1.0" in result.stdout


def test_plugins_list_every_package() -> None:
    result = invoke("plugins", "list", "--json")
    assert result.exit_code == 0
    dists = {p["distribution"] for p in json.loads(result.stdout)}
    assert {
        "telescope-core",
        "telescope-fsdp",
        "telescope-megatron",
        "telescope-envs",
        "telescope-sandboxes",
    } <= dists
    text = invoke("plugins", "list").stdout
    assert "megatron" in text and "unavailable" in text


def test_config_show_merges_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, {**GOOD, "learning_rate": 1e-5})
    result = invoke("config", "show", str(path), "--learning_rate", "5e-7")
    assert result.exit_code == 0, result.output
    shown = yaml.safe_load(result.stdout)
    assert shown["learning_rate"] == 5e-7 and shown["group_size"] == 8
    assert shown["environments"][0]["name"] == "reverse_text"


def test_config_show_sources(tmp_path: Path) -> None:
    path = write(tmp_path, {**GOOD, "group_size": 4})
    result = invoke("config", "show", str(path), "--sources", "--seq_len", "1024")
    assert result.exit_code == 0, result.output
    rows = {
        line.split(":")[0]: line.rsplit("# ", 1)[1] for line in result.stdout.splitlines() if line.strip()
    }
    assert rows["seq_len"] == "cli" and rows["group_size"] == str(path) and rows["top_p"] == "defaults"
    assert yaml.safe_load(result.stdout)["seq_len"] == 1024  # the annotated output is still YAML


def test_examples_show(tmp_path: Path) -> None:
    examples = sorted(Path(__file__).resolve().parents[2].glob("examples/*.yaml"))
    assert examples
    for example in examples:
        result = invoke("config", "show", str(example), "--learning_rate", "5e-7")
        assert result.exit_code == 0, (example, result.output)
        assert yaml.safe_load(result.stdout)["learning_rate"] == 5e-7


def test_validate_ok(tmp_path: Path) -> None:
    result = invoke("config", "validate", str(write(tmp_path, GOOD)))
    assert result.exit_code == 0 and "valid" in result.stdout


def test_debug_shows_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, {**GOOD, "group_size": "x"})
    plain = invoke("config", "validate", str(path))
    assert "Traceback" not in plain.output and plain.exit_code == 2
    debug = invoke("config", "validate", str(path), "--debug")
    assert debug.exit_code == 2 and "Traceback" in debug.output


ENV = [{"name": "reverse_text"}]
# (id, run-yaml content or None for GOOD, extra CLI args, text the message must contain)
BAD_CONFIGS = [
    ("typo-top", {**GOOD, "learnin_rate": 0.1}, [], "learnin_rate"),
    ("typo-suggests", {**GOOD, "grop_size": 2}, [], "group_size"),
    ("type-int", {**GOOD, "group_size": "eight"}, [], "group_size"),
    ("type-bool", {**GOOD, "use_tis": "sometimes"}, [], "use_tis"),
    ("type-list", {**GOOD, "wandb_tags": "a"}, [], "wandb_tags"),
    ("range-clip-low", {**GOOD, "clip_low": 1.5}, [], "clip_low"),
    ("range-temperature", {**GOOD, "temperature": -1.0}, [], "temperature"),
    ("range-top-p-zero", {**GOOD, "top_p": 0.0}, [], "top_p"),
    ("range-top-p-high", {**GOOD, "top_p": 1.5}, [], "top_p"),
    ("range-lr", {**GOOD, "learning_rate": 0.0}, [], "learning_rate"),
    ("range-min-lr", {**GOOD, "min_lr_ratio": 2.0}, [], "min_lr_ratio"),
    ("range-gpu-mem", {**GOOD, "gpu_memory_utilization": 0.0}, [], "gpu_memory_utilization"),
    ("range-port", {**GOOD, "otlp_receiver_port": 70000}, [], "otlp_receiver_port"),
    ("range-async", {**GOOD, "max_async_rollout": -1}, [], "max_async_rollout"),
    ("range-minibatches", {**GOOD, "number_of_minibatches": 0}, [], "number_of_minibatches"),
    ("literal-scheduler", {**GOOD, "lr_scheduler": "exponential"}, [], "lr_scheduler"),
    ("literal-dtype", {**GOOD, "model_dtype": "fp16"}, [], "model_dtype"),
    (
        "literal-placement",
        {**GOOD, "ray_trainer_placement_strategy": "pack"},
        [],
        "ray_trainer_placement_strategy",
    ),
    ("literal-engine", {**GOOD, "inference_engine": "sglang"}, [], "inference_engine"),
    ("checkpoint-true", {**GOOD, "checkpoint_every": True}, [], "checkpoint_every"),
    (
        "tp-divides",
        {**GOOD, "inference_num_workers": 3, "inference_tensor_parallel_size": 2},
        [],
        "inference_tensor_parallel_size",
    ),
    ("tis-clip-rollout", {**GOOD, "use_tis": True, "use_ppo_clip": True}, [], "ppo_clip_ref_logprobs: batch"),
    ("clip-cispo", {**GOOD, "algorithm": "cispo", "use_ppo_clip": True}, [], "use_ppo_clip"),
    ("clip-gspo", {**GOOD, "algorithm": "gspo", "use_ppo_clip": True}, [], "use_ppo_clip"),
    ("clip-sapo", {**GOOD, "algorithm": "sapo", "use_ppo_clip": True}, [], "use_ppo_clip"),
    ("batch-rloo", {**GOOD, "algorithm": "rloo", "advantage_norm": "batch"}, [], "advantage_norm"),
    ("batch-drgrpo", {**GOOD, "algorithm": "dr_grpo", "advantage_norm": "batch"}, [], "advantage_norm"),
    (
        "reinforce-group",
        {**GOOD, "algorithm": "reinforce_pp", "advantage_norm": "group"},
        [],
        "advantage_norm",
    ),
    ("lanes", {**GOOD, "enable_individual_sample_lanes": False}, [], "free_lane_after_generation"),
    ("no-envs", {"environments": []}, [], "environments"),
    ("envs-missing", {"learning_rate": 0.1}, [], "environments"),
    (
        "env-weight-zero",
        {"environments": [{"name": "reverse_text", "weight": 0}]},
        [],
        "environments[0].weight",
    ),
    (
        "env-weight-neg",
        {"environments": [{"name": "reverse_text", "weight": -1.0}]},
        [],
        "environments[0].weight",
    ),
    (
        "env-typo-key",
        {"environments": [{"name": "reverse_text", "wieght": 1.0}]},
        [],
        "environments[0].wieght",
    ),
    (
        "env-reward-range",
        {"environments": [{"name": "reverse_text", "reward_min": 1.0, "reward_max": 0.0}]},
        [],
        "reward_min",
    ),
    ("env-unknown", {"environments": [{"name": "reverse_txt"}]}, [], "environments[0].name"),
    (
        "env-bad-kwargs",
        {"environments": [{"name": "reverse_text", "kwargs": {"no_such_kwarg": 1}}]},
        [],
        "environments[0].kwargs",
    ),
    ("eval-unknown", {**GOOD, "evals": [{"name": "math5000"}]}, [], "evals[0].name"),
    (
        "eval-every-zero",
        {**GOOD, "evals": [{"name": "reverse_text", "eval_every": 0}]},
        [],
        "evals[0].eval_every",
    ),
    (
        "eval-no-samples",
        {**GOOD, "evals": [{"name": "reverse_text", "num_samples": 0}]},
        [],
        "evals[0].num_samples",
    ),
    (
        "backend-kwargs",
        {**GOOD, "train_backend_kwargs": {"optimiser": "sgd"}},
        [],
        "train_backend_kwargs.optimiser",
    ),
    (
        "engine-kwargs",
        {**GOOD, "inference_engine": "transformers", "inference_engine_kwargs": {"max_num_seqs": 0}},
        [],
        "inference_engine_kwargs.max_num_seqs",
    ),
    ("model-builtin-typo", {**GOOD, "model": "telescope/tiny-revers"}, [], "telescope/tiny-reverse"),
    ("algo-unknown", {**GOOD, "algorithm": "grop"}, [], "algorithm"),
    ("backend-unknown", {**GOOD, "train_backend": "fdsp"}, [], "train_backend"),
    ("backend-unavailable", {**GOOD, "train_backend": "megatron"}, [], "train_backend"),
    ("override-unknown", None, ["--learnig_rate", "1"], "learnig_rate"),
    ("override-no-value", None, ["--learning_rate"], "learning_rate"),
    ("override-not-flag", None, ["learning_rate=5"], "learning_rate=5"),
    ("override-bad-type", None, ["--group_size", "[1, 2]"], "group_size"),
    ("override-bad-yaml", None, ["--environments", "[{name: x"], "environments"),
    ("missing-file", "MISSING", [], "does-not-exist.yaml"),
    ("invalid-yaml", "environments: [\n  - name: x\n bad", [], "not valid YAML"),
    ("not-mapping", "- a\n- b\n", [], "mapping"),
]


@pytest.mark.parametrize(
    ("content", "args", "needle"), [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS]
)
def test_bad_config_exit_2_names_field(tmp_path: Path, content: object, args: list[str], needle: str) -> None:
    if content == "MISSING":
        path = tmp_path / "does-not-exist.yaml"
    else:
        path = write(tmp_path, GOOD if content is None else content)
    for command in ("validate", "show"):
        result = invoke("config", command, str(path), *args)
        assert result.exit_code == 2, (command, result.output)
        assert needle in result.stderr, result.stderr
        assert "Traceback" not in result.output
    train = invoke("train", str(path), *args)
    assert train.exit_code == 2 and needle in train.stderr


def test_at_least_30_bad_configs() -> None:
    assert len({c[0] for c in BAD_CONFIGS}) >= 30
