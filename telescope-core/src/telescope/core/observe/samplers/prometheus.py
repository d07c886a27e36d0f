"""Scrape vLLM's Prometheus ``/metrics`` endpoint into system samples (``source: "vllm"``).

Reduction (as the reference dashboard does): the ``vllm:`` prefix is stripped; every
series is summed across its label sets (gauges, counters); a histogram or summary
becomes ``<name>_mean = _sum / _count`` (buckets and ``_created`` are dropped).

vLLM's ``cache_config_info`` (an info metric: always 1, its labels say what it means) adds the
KV-cache block size and block count the server runs with, ``kv_cache_block_size`` and
``kv_cache_num_blocks`` (on vLLM's CPU build too: its blocks from ``VLLM_CPU_KVCACHE_SPACE``), and
its capacity in tokens where vLLM says it (``kv_cache_size_tokens``, vLLM >= 0.32): a request reuses
only whole cached blocks, so the block size says which prompts can hit at all; ``kv_cache_tokens``
is the server's prefix-cache size the router uses (``rollouts/routing.py``).

Each server's prefix-cache hit rate since its previous scrape, ``prefix_cache_hit_rate``, is
derived from vLLM's own counters (prompt tokens looked up, and found, in its prefix cache: what
sticky routing, ``rollouts/routing.py``, is for). The transformers engine keeps no prefix cache: a
finished sequence's keys and values are dropped and every request prefills its whole prompt.
"""

from __future__ import annotations

import logging
import math
import re
import socket
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from telescope.core.observe.periodic import PeriodicThread

__all__ = [
    "PrometheusScraper",
    "cache_config_metrics",
    "info_labels",
    "kv_cache_tokens",
    "parse_prometheus",
    "prefix_cache_hit_rate",
    "reduce_vllm_metrics",
]

PREFIX_CACHE_QUERIES = "prefix_cache_queries_total"
PREFIX_CACHE_HITS = "prefix_cache_hits_total"
#: ``vllm:cache_config_info`` label -> the metric it is kept as.
CACHE_CONFIG_LABELS = {
    "block_size": "kv_cache_block_size",
    "num_gpu_blocks": "kv_cache_num_blocks",
    "kv_cache_size_tokens": "kv_cache_size_tokens",
}
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')

_log = logging.getLogger("telescope.observe")


def parse_prometheus(text: str) -> dict[str, float]:
    """``{metric name: value summed over label sets}`` from Prometheus text exposition.

    The one parser of ``/metrics`` text (this scraper and ``InferenceClient.metrics``): the value is
    the first field after the name and labels (a trailing timestamp is not the value, spaces inside
    label values do not split), comments and non-finite values (NaN of an empty summary) are skipped.
    """
    out: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, _, rest = line.partition("{")
            rest = rest.rsplit("}", 1)[-1]
        else:
            name, _, rest = line.partition(" ")
        fields = rest.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if math.isfinite(value):
            out[name.strip()] += value
    return dict(out)


def info_labels(text: str, name: str) -> dict[str, str]:
    """The labels of the first sample of ``name`` in Prometheus text (an info metric's value is always 1:
    its labels are what it says); ``{}`` when there is none."""
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return dict(_LABEL.findall(line[len(name) + 1 : line.rfind("}")]))
    return {}


def cache_config_metrics(text: str) -> dict[str, float]:
    """``CACHE_CONFIG_LABELS`` of vLLM's ``cache_config_info`` as numbers (those it has: ``None`` before
    the KV cache is sized is left out)."""
    labels = info_labels(text, "vllm:cache_config_info")
    return {
        metric: float(labels[label])
        for label, metric in CACHE_CONFIG_LABELS.items()
        if labels.get(label, "").isdigit()
    }


def kv_cache_tokens(metrics: dict[str, float]) -> int | None:
    """A server's KV cache (its prefix cache) in tokens, from ``cache_config_metrics``: vLLM's own
    ``kv_cache_size_tokens`` (right for hybrid models too), else blocks x block size; None when the
    server says neither (not vLLM, or its cache not sized yet)."""
    if metrics.get("kv_cache_size_tokens"):
        return int(metrics["kv_cache_size_tokens"])
    blocks, size = metrics.get("kv_cache_num_blocks"), metrics.get("kv_cache_block_size")
    return int(blocks * size) if blocks and size else None


def reduce_vllm_metrics(raw: dict[str, float], prefix: str = "vllm:") -> dict[str, float]:
    """Keep ``prefix`` series, strip it, and turn ``_sum``/``_count`` pairs into ``_mean``."""
    series = {k[len(prefix) :]: v for k, v in raw.items() if k.startswith(prefix)}
    out: dict[str, float] = {}
    for name, value in series.items():
        if name.endswith(("_bucket", "_created")):
            continue
        if name.endswith("_sum") and name[:-4] + "_count" in series:
            count = series[name[:-4] + "_count"]
            out[name[:-4] + "_mean"] = value / count if count else 0.0
            continue
        if name.endswith("_count") and name[:-6] + "_sum" in series:
            continue
        out[name] = value
    return out


def prefix_cache_hit_rate(previous: dict[str, float] | None, metrics: dict[str, float]) -> float | None:
    """Prompt tokens found in the prefix cache over those looked up between two scrapes (reduced
    metrics); None when the counters are missing or no token was looked up (a restarted server's
    counters start again from 0: measured from 0 then)."""
    queries, hits = metrics.get(PREFIX_CACHE_QUERIES), metrics.get(PREFIX_CACHE_HITS)
    if queries is None or hits is None:
        return None
    before_q = previous.get(PREFIX_CACHE_QUERIES, 0.0) if previous else 0.0
    before_h = previous.get(PREFIX_CACHE_HITS, 0.0) if previous else 0.0
    if queries < before_q:  # the server restarted
        before_q = before_h = 0.0
    looked_up = queries - before_q
    return (hits - before_h) / looked_up if looked_up > 0 else None


class PrometheusScraper:
    """Thread that GETs ``{url}/metrics`` of each server every ``interval_s`` and calls back.

    ``callback({"time", "node", "source": "vllm", "server": index, "metrics": {...}})``. A
    server that cannot be reached is counted in ``errors`` and logged once.
    """

    def __init__(
        self,
        urls: dict[int, str],
        callback: Callable[[dict[str, Any]], None],
        interval_s: float = 1.0,
        timeout_s: float = 1.0,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"scrape interval {interval_s} must be > 0 seconds")
        self.urls = {int(k): v.rstrip("/") for k, v in urls.items()}
        self._callback = callback
        self._interval = interval_s
        self._timeout = timeout_s
        self.errors: dict[int, int] = defaultdict(int)
        self._previous: dict[int, dict[str, float]] = {}
        """Each server's metrics at its previous scrape (the hit rate is over the interval)."""
        self._thread = PeriodicThread(self.scrape_all, interval_s, "telescope-vllm-metrics")

    @property
    def interval_s(self) -> float:
        """Seconds between two scrapes of every server."""
        return self._interval

    def scrape(self, server: int) -> dict[str, Any]:
        from telescope.core.cluster.run_secret import auth_headers

        # a run's vLLM servers answer /metrics only with the run's secret (vllm_engine.guard)
        request = urllib.request.Request(f"{self.urls[server]}/metrics", headers=auth_headers())
        with urllib.request.urlopen(request, timeout=self._timeout) as resp:
            text = resp.read().decode("utf-8", errors="replace")
        metrics = reduce_vllm_metrics(parse_prometheus(text)) | cache_config_metrics(text)
        rate = prefix_cache_hit_rate(self._previous.get(server), metrics)
        self._previous[server] = dict(metrics)
        if rate is not None:
            metrics["prefix_cache_hit_rate"] = rate
        return {
            "time": time.time(),
            "node": socket.gethostname(),
            "source": "vllm",
            "server": server,
            "metrics": metrics,
        }

    def scrape_all(self) -> None:
        """Scrape every server once; one that cannot be read is counted (logged the first time)."""
        for server in self.urls:
            try:
                self._callback(self.scrape(server))
            except Exception as exc:  # noqa: BLE001 - a busy or restarting server must not stop scraping
                self.errors[server] += 1
                if self.errors[server] == 1:
                    _log.warning(
                        "vLLM metrics of server %d (%s) unreadable: %s", server, self.urls[server], exc
                    )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()
