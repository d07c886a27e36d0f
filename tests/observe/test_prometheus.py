"""vLLM Prometheus scraping: parsing, reduction, and a scrape from a local HTTP server."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from telescope.core.cluster.run_secret import ENV_VAR, authorized, current_run_secret
from telescope.core.observe import LoggerHub, RunDirReader
from telescope.core.observe.loggers.local import LocalLogger
from telescope.core.observe.samplers.prometheus import (
    PrometheusScraper,
    parse_prometheus,
    reduce_vllm_metrics,
)
from telescope.core.testing import make_config

EXPOSITION = """# HELP vllm:num_requests_running Number of requests running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:prompt_tokens_total{engine="0",model_name="m"} 1000.0
vllm:prompt_tokens_created{engine="0",model_name="m"} 1.7e9
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 3.0
vllm:time_to_first_token_seconds_sum{model_name="m"} 1.5
vllm:time_to_first_token_seconds_count{model_name="m"} 6.0
vllm:e2e_request_latency_seconds_sum{model_name="m"} 0.0
vllm:e2e_request_latency_seconds_count{model_name="m"} 0.0
python_gc_objects_collected_total{generation="0"} 123.0
process_start_time_seconds 1.7e9
"""


def test_parse_and_reduce() -> None:
    raw = parse_prometheus(EXPOSITION)
    assert raw["vllm:num_requests_running"] == 5.0 and raw["process_start_time_seconds"] == 1.7e9
    reduced = reduce_vllm_metrics(raw)
    assert reduced == {
        "num_requests_running": 5.0,
        "kv_cache_usage_perc": 0.25,
        "prompt_tokens_total": 1000.0,
        "time_to_first_token_seconds_mean": 0.25,
        "e2e_request_latency_seconds_mean": 0.0,
    }


class _Handler(BaseHTTPRequestHandler):
    """A run's vLLM server: /metrics with the run's secret only (vllm_engine.guard)."""

    def do_GET(self) -> None:
        if not authorized(self.headers.get("Authorization"), current_run_secret()):
            self.send_response(401)
            self.end_headers()
            return
        body = EXPOSITION.encode() if self.path == "/metrics" else b""
        self.send_response(200 if body else 404)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_scrape_into_the_run_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "scrape-secret")
    server = HTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        hub = LoggerHub([LocalLogger()])
        hub.start(make_config(use_wandb=False), tmp_path, system_metrics=False)
        url = f"http://127.0.0.1:{server.server_address[1]}"
        hub.add_prometheus_scraper({0: url, 1: "http://127.0.0.1:9"}, interval_s=0.02)
        deadline = time.monotonic() + 10
        while not RunDirReader(tmp_path).system() and time.monotonic() < deadline:
            time.sleep(0.02)
        hub.finish("finished")
    finally:
        server.shutdown()
    samples = RunDirReader(tmp_path).system()
    assert samples and all(s["source"] == "vllm" and s["server"] == 0 for s in samples)
    assert samples[0]["metrics"]["time_to_first_token_seconds_mean"] == 0.25
    assert hub._scrapers[0].errors[1] >= 1  # the unreachable server is counted, not fatal
    with pytest.raises(ValueError, match="must be > 0"):
        PrometheusScraper({}, print, interval_s=0)


def test_one_parser_for_both_engines_metrics() -> None:
    from telescope.core.inference import client

    assert client.parse_prometheus is parse_prometheus  # InferenceClient.metrics parses with it too


def test_the_value_is_the_field_after_the_labels_not_a_timestamp() -> None:
    text = (
        'vllm:num_requests_running{model_name="my model"} 2.0 1700000000000\n'  # a space in a label value
        "vllm:num_requests_waiting 1 1700000000000\n"
        'vllm:request_latency{quantile="0.5"} NaN\n'  # an empty summary: skipped, not summed
        "  vllm:kv_cache_usage_perc 0.5  \n"
    )
    assert parse_prometheus(text) == {
        "vllm:num_requests_running": 2.0,
        "vllm:num_requests_waiting": 1.0,
        "vllm:kv_cache_usage_perc": 0.5,
    }


def test_the_clients_metrics_strip_either_engines_prefix() -> None:
    from telescope.core.inference.client import engine_metrics

    # What the transformers engine's /metrics writes (inference/transformers_engine/app.py) ...
    transformers = 'telescope:num_requests_running{model_name="m"} 1.0\ntelescope:generation_tokens_total{model_name="m"} 42.0\n'
    assert engine_metrics(transformers) == {"num_requests_running": 1.0, "generation_tokens_total": 42.0}
    # ... and vLLM's: series summed over label sets, the vllm: prefix gone.
    assert engine_metrics(EXPOSITION)["num_requests_running"] == 5.0
    assert engine_metrics(EXPOSITION)["process_start_time_seconds"] == 1.7e9
