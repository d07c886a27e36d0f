"""End to end on Ray: 2 FSDP trainer ranks (gloo), 2 transformers inference servers, real weight sync.

One run covers: on-policy logprob agreement between engine and trainer (fp32,
max_async_rollout 0), a fingerprint-verified weight change after every step, multi-environment
sampling with a multi-turn environment (wordle, exact token reuse across turns), evals before,
during (on the second server, held at the eval step's weights) and after training with
held-out samples, and the run directory files. A third-party plugin file (``run_watcher.py``,
loaded as a user's ``-p`` plugin) sees every group, event, step, eval and run fact the
built-in ``local`` logger wrote (one channel: the run hooks). ~1.5 minutes on 2 cores.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from ports import free_port_block

from telescope.core.config import load_config
from telescope.core.observe import RunDirReader
from telescope.core.plugins import load_plugins, local_plugin_name

pytest.importorskip("ray")


WATCHER = Path(__file__).with_name("run_watcher.py")


def read_jsonl(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The run directory, and what a third-party plugin file (``run_watcher.py``) saw of the run."""
    from telescope.core.runtime import run_training

    run_dir = tmp_path_factory.mktemp("e2e") / "run"
    pset, registry = load_plugins(files=[str(WATCHER)])
    cfg = load_config(
        None,
        {
            "model": "telescope/tiny",
            "model_dtype": "float32",
            "mixed_precision_dtype": None,
            "environments": [
                {"name": "reverse_text", "weight": 1.0},
                {"name": "wordle", "weight": 1.0, "kwargs": {"max_turns": 2}},
            ],
            "inference_engine": "transformers",
            "inference_num_workers": 2,
            "trainer_num_workers": 2,
            "ray_inference_cpus_per_worker": 0.5,
            "ray_trainer_cpus_per_worker": 0.5,
            "ray_address": "local",
            "inference_base_port": free_port_block(2),
            "group_size": 4,
            "prompts_batch_size_for_trainer": 2,
            "number_of_steps": 3,
            "max_async_rollout": 0,
            "max_tokens": 12,
            "seq_len": 1024,
            "pad_to_multiple_of": 8,
            "learning_rate": 1e-3,
            "discard_group_zero_advantage": False,
            "use_wandb": False,
            "evals": [
                {
                    "name": "reverse_text",
                    "eval_every": 2,
                    "num_samples": 4,
                    "separate_eval_samples": True,
                    "pass_k": [1, 2],
                }
            ],
            "eval_before_training": True,
            "eval_after_training": True,
            "run_dir": str(run_dir),
            "seed": 3,
            "use_tensorboard": _installed("tensorboard"),
            "use_mlflow": _installed("mlflow"),
        },
        registry,
    )
    assert run_training(cfg, pset, registry) == 0
    return run_dir, pset.pm.get_plugin(local_plugin_name(str(WATCHER))).seen


@pytest.fixture(scope="module")
def run_dir(run: tuple[Path, dict[str, Any]]) -> Path:
    return run[0]


def test_run_directory_holds_the_resolved_config(run_dir: Path) -> None:
    import yaml

    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert resolved["inference_engine"] == "transformers" and resolved["number_of_steps"] == 3
    assert Path(resolved["model"]).is_dir()  # the built-in name resolved to its built folder


def test_every_step_logged_with_rewards_and_trainer_metrics(run_dir: Path) -> None:
    steps = read_jsonl(run_dir / "metrics.jsonl")
    assert [int(s["step"]) for s in steps] == [1, 2, 3]
    for s in steps:
        metrics = s["metrics"] if "metrics" in s else s
        assert "reward/mean" in metrics and "grad_norm" in metrics and "learning_rate" in metrics
        assert metrics["timing_step_total"] > 0


def test_on_policy_logprobs_agree_at_step_0(run_dir: Path) -> None:
    steps = read_jsonl(run_dir / "metrics.jsonl")
    kls = [(s["metrics"] if "metrics" in s else s)["kl_divergence_inference"] for s in steps]
    assert abs(kls[0]) <= 1e-6, kls
    assert all(abs(k) <= 1e-4 for k in kls), kls  # every batch is on-policy with max_async_rollout 0


def test_weights_change_and_are_verified_every_step(run_dir: Path) -> None:
    events = RunDirReader(run_dir).events()
    syncs = [e for e in events if e["type"] == "weight_sync" and e["phase"] == "end"]
    digests = [e["attrs"]["digest"] for e in syncs]
    assert len(digests) == 3 and all(digests) and len(set(digests)) == 3


def test_multi_env_and_multi_turn_rollouts(run_dir: Path) -> None:
    rows = RunDirReader(run_dir).rollouts()
    envs = {r["env"] for r in rows}
    assert envs == {"reverse_text", "wordle"}
    wordle = [r for r in rows if r["env"] == "wordle"]
    assert any(r["num_turns"] == 2 for r in wordle)
    generation = [e for e in RunDirReader(run_dir).events() if e["type"] == "generation"]
    assert {e["phase"] for e in generation} == {"start", "end"}


def test_evals_before_during_and_after_training(run_dir: Path) -> None:
    rows = read_jsonl(run_dir / "evals" / "metrics.jsonl")
    assert [(r["step"], r["name"]) for r in rows] == [
        (0, "reverse_text"),
        (2, "reverse_text"),
        (3, "reverse_text"),
    ]
    for r in rows:
        metrics = r["metrics"]
        assert metrics["num_samples"] == 4 and metrics["num_completions"] == 8  # n = max k = 2
        assert {"pass@1/reward", "pass@2/reward"} <= set(metrics)
        assert metrics["pass@1/reward"] <= metrics["pass@2/reward"] + 1e-12


def test_eval_samples_never_reach_training(run_dir: Path) -> None:
    eval_prompts = {r["prompt"] for r in read_jsonl(run_dir / "evals" / "samples.jsonl")}
    trained = {r["prompt_text"] for r in RunDirReader(run_dir).rollouts() if r["env"] == "reverse_text"}
    assert len(eval_prompts) == 4 and trained and not eval_prompts & trained


def test_every_run_file_follows_the_documented_schema(run_dir: Path) -> None:
    from telescope.core.observe import RolloutRecord
    from telescope.core.observe.rundir.records import EVENT_TYPES, TimelineEvent

    reader = RunDirReader(run_dir)
    # Field sets come from the record classes (tests/observe/test_schema_doc.py ties them to the doc).
    token_view = {"completion_token_texts", "completion_logprobs"}  # written only when set
    rollout_fields = set(
        RolloutRecord(step=1, group_id=0, env="e", sample_id=0, **dict.fromkeys(token_view, [])).to_dict()
    )
    rows = reader.rollouts()
    assert rows and all(set(r) in (rollout_fields, rollout_fields - token_view) for r in rows)
    # completions within rollout_token_view_max_tokens (every trained one here) carry a text and
    # a logprob per token
    assert all("completion_token_texts" in r for r in rows if r["kept"])
    viewed = [r for r in rows if "completion_token_texts" in r]
    assert all(
        len(r["completion_token_texts"]) == len(r["completion_logprobs"]) == len(r["completion_ids"])
        for r in viewed
    )
    assert all({"generation_s", "reward_s"} <= set(r["timings"]) for r in rows)
    event_fields = set(TimelineEvent(type="run").to_dict())
    events = reader.events()
    assert all(set(e) == event_fields and e["type"] in EVENT_TYPES for e in events)
    # generation and reward spans per sample, the trainer step span, syncs, evals
    kinds = {(e["type"], e["phase"]) for e in events}
    for kind in ("generation", "reward", "trainer", "weight_sync"):
        assert {(kind, "start"), (kind, "end")} <= kinds, kind
    assert ("eval", "instant") in kinds
    assert {e["name"] for e in events if e["type"] == "trainer"} == {"train_step"}
    assert reader.meta["status"] == "finished" and reader.meta["schema_version"] == 3
    environments = {e["name"]: e for e in reader.meta["info"]["environments"]}
    assert set(environments) == {"reverse_text", "wordle"} and environments["wordle"]["multi_turn"]
    system = read_jsonl(run_dir / "system.jsonl")
    assert any(r["source"] == "system" and "cpu_utilization_percent" in r["metrics"] for r in system)
    assert (run_dir / "logs" / "telescope.stdout.log").is_file()


def test_torch_thread_counts_recorded_in_run_json(run_dir: Path) -> None:
    """Sync mode (max_async_rollout 0): each side shares the node's cores among its 2 processes."""
    import os

    expected = {"threads": max(1, len(os.sched_getaffinity(0)) // 2), "rule": "sync: "}
    info = RunDirReader(run_dir).meta["info"]["torch_threads"]
    for side in ("trainer", "inference"):
        assert [c["threads"] for c in info[side]] == [expected["threads"]] * 2, side
        assert all(c["rule"].startswith(expected["rule"]) for c in info[side]), info


def test_step_metrics_carry_the_seed_names(run_dir: Path) -> None:
    steps = [s["metrics"] if "metrics" in s else s for s in read_jsonl(run_dir / "metrics.jsonl")]
    seed_step = {"entropy", "kl_divergence_inference", "grad_norm", "learning_rate"}
    seed_timing = {
        f"timing_{p}_total"
        for p in (
            "step",
            "forward",
            "backward",
            "loss_computation",
            "compute_kl",
            "compute_entropy",
            "data_to_device",
            "prepare_tensors",
            "weight_sync_trainer",
            "weight_sync_inference",
        )
    } | {"timing_step_active", "timing_waiting_for_data", "timing_forward_microbatch_mean"}
    seed_rollout = {
        "rollouts/stop_reason_length_pct",
        "rollouts/group_length_gini_mean",
        "rollouts/group_length_max_median_ratio_mean",
    }
    for metrics in steps:
        missing = (seed_step | seed_timing | seed_rollout) - set(metrics)
        assert not missing, missing


def test_tensorboard_and_mlflow_hold_the_steps_and_evals(run_dir: Path) -> None:
    """The optional loggers, on in this run when installed, saw every step and eval the run directory has."""
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    steps = {
        int(s["step"]): s["metrics"] if "metrics" in s else s for s in read_jsonl(run_dir / "metrics.jsonl")
    }
    evals = {
        r["step"]: r["metrics"]["pass@1/reward"] for r in read_jsonl(run_dir / "evals" / "metrics.jsonl")
    }
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tb = {t: {e.step: e.value for e in acc.Scalars(t)} for t in acc.Tags()["scalars"]}
    assert tb["reward/mean"] == pytest.approx({k: m["reward/mean"] for k, m in steps.items()}, rel=1e-6)
    assert tb["eval/reverse_text/pass@1/reward"] == pytest.approx(evals, rel=1e-6)
    assert tb["timeline/trainer/train_step/count"] == {1: 1.0, 2: 1.0, 3: 1.0}
    assert sorted(e.step for e in acc.Tensors("rollouts/text_summary")) == [1, 2, 3]
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
    [run] = client.search_runs([client.get_experiment_by_name("telescope").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["number_of_steps"] == "3"
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "reward/mean")}
    assert history == pytest.approx({k: m["reward/mean"] for k, m in steps.items()})
    assert {
        m.step for m in client.get_metric_history(run.info.run_id, "eval/reverse_text/pass_1/reward")
    } == set(evals)


def test_progress_reaches_telescope_log_and_server_logs_hold_no_access_lines(run_dir: Path) -> None:
    lines = (run_dir / "logs" / "telescope.log").read_text().splitlines()
    progress = [
        ln.split(" INFO telescope.progress ", 1)[1] for ln in lines if " INFO telescope.progress " in ln
    ]
    assert (
        progress[0].startswith("start: model telescope/tiny, algorithm grpo, ") and "3 steps" in progress[0]
    )
    steps = [p for p in progress if p.startswith("step ")]
    assert [s.split(" | ")[0] for s in steps] == ["step 1/3", "step 2/3", "step 3/3"]
    assert steps[-1].startswith("step 3/3 | ETA 0s | reward ")
    for server in sorted((run_dir / "logs" / "inference").glob("server_*.log")):
        text = server.read_text()
        # inference_access_log false: no line per request (hundreds), one summary when the server stops
        assert "aiohttp.access" not in text and "requests in the last" in text, server


# --- one channel: a third-party plugin sees what the built-in loggers see ------------------------


def plain(value: Any) -> Any:
    """What a value looks like after a JSON round trip (the run directory's files)."""
    return json.loads(json.dumps(value))


def test_a_plugin_saw_every_step_with_the_metrics_the_run_directory_holds(
    run: tuple[Path, dict[str, Any]],
) -> None:
    run_dir, seen = run
    written = [{"step": s["step"], "metrics": s["metrics"]} for s in RunDirReader(run_dir).steps()]
    assert [s["step"] for s in written] == [1, 2, 3]
    assert plain(seen["steps"]) == written
    assert seen["start"] == [str(run_dir.resolve())] and seen["end"] == ["completed"]


def test_a_plugin_saw_every_group_whose_rollouts_the_run_directory_holds(
    run: tuple[Path, dict[str, Any]],
) -> None:
    run_dir, seen = run
    rows = RunDirReader(run_dir).rollouts()
    written = Counter((r["step"], r["group_id"], r["discard_reason"]) for r in rows)
    reported = Counter({(step, gid, reason): n for step, gid, n, reason in seen["groups"] if n})
    assert reported == written and sum(written.values()) >= 3 * 2 * 4  # 3 steps of 2 groups x 4 kept
    assert len({gid for _, gid, _, _ in seen["groups"]}) == len(seen["groups"]), "a group reported twice"
    assert sorted(seen["rollouts"]) == [1, 2, 3]
    for step, pairs in seen["rollouts"].items():  # step_end's records are its groups' records
        assert sorted(pairs) == sorted((r["group_id"], r["sample_id"]) for r in rows if r["step"] == step)


def test_a_plugin_saw_every_event_in_the_order_the_run_directory_holds(
    run: tuple[Path, dict[str, Any]],
) -> None:
    run_dir, seen = run
    written = RunDirReader(run_dir).events()
    assert plain(seen["events"]) == written
    types = Counter((e["type"], e["phase"]) for e in written)
    assert types[("trainer", "end")] == 3 and types[("weight_sync", "end")] >= 3
    assert types[("generation", "start")] >= 24 and types[("eval", "instant")] == 3  # steps 0, 2, 3


def test_a_plugin_saw_every_eval_result(run: tuple[Path, dict[str, Any]]) -> None:
    run_dir, seen = run
    written = [
        {k: r[k] for k in ("step", "name", "metrics", "samples")} for r in RunDirReader(run_dir).evals()
    ]
    assert [e["step"] for e in written] == [0, 2, 3]
    assert plain(seen["evals"]) == written


def test_a_plugin_saw_the_run_info_run_json_holds(run: tuple[Path, dict[str, Any]]) -> None:
    run_dir, seen = run
    info = RunDirReader(run_dir).meta["info"]
    assert {"setup", "environments", "evals", "torch_threads"} <= set(seen["info"])
    assert {k: info[k] for k in seen["info"]} == plain(seen["info"])


def test_a_plugin_saw_every_system_sample(run: tuple[Path, dict[str, Any]]) -> None:
    run_dir, seen = run
    written = [
        (s["time"], s["node"], s["source"], sorted(s["metrics"]))
        for s in read_jsonl(run_dir / "system.jsonl")
    ]
    assert len(written) >= 2 and "system" in {source for _, _, source, _ in written}
    assert sorted(plain(seen["system"])) == sorted(plain(written))  # two threads may interleave
