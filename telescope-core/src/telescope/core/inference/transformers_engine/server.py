"""Start a transformers-engine server: in a thread (tests, benchmarks) or as ``python -m`` (runs).

``python -m telescope.core.inference.transformers_engine.server --config run.json --index 0
--host 127.0.0.1 --port 8100`` serves the model of the *resolved* run config it is given (the
whole config travels as JSON, so nothing falls back to packaged defaults).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import threading
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from telescope.core.cluster.threads import ThreadChoice, choose_torch_threads
from telescope.core.config import TelescopeConfig
from telescope.core.inference.settings import TransformersEngineKwargs
from telescope.core.inference.transformers_engine.app import build_app
from telescope.core.inference.transformers_engine.core import EngineOptions, GenerationEngine
from telescope.core.inference.transformers_engine.requestlog import server_logging
from telescope.core.inference.transformers_engine.weights import ServerWeightSync
from telescope.core.weights.settings import serving_dtype

__all__ = [
    "InProcessServer",
    "ServerState",
    "check_config",
    "load_server_state",
    "main",
    "server_threads",
    "start_in_thread",
]

log = logging.getLogger("telescope.inference.transformers")


@dataclass
class ServerState:
    """What the request handlers share."""

    engine: GenerationEngine
    tokenizer: Any
    options: EngineOptions
    weight_sync: ServerWeightSync
    served_model_name: str
    vocab_size: int


def check_config(cfg: TelescopeConfig) -> None:
    """Reject the run-config values this engine cannot honour (one message naming field, value and fix)."""
    if cfg.inference_tensor_parallel_size != 1:
        raise ValueError(
            f"inference_tensor_parallel_size: {cfg.inference_tensor_parallel_size} is not supported by the "
            "transformers engine (one process per server); set it to 1 or use inference_engine: vllm"
        )


def _notes(cfg: TelescopeConfig, device: str) -> list[str]:
    notes = []
    if device == "cpu":
        notes.append(f"gpu_memory_utilization={cfg.gpu_memory_utilization} has no meaning on CPU: ignored")
    if cfg.enable_vllm_tracing:
        notes.append("enable_vllm_tracing: the transformers engine emits no OpenTelemetry traces: ignored")
    return notes


def server_threads(cfg: TelescopeConfig, kwargs: TransformersEngineKwargs) -> ThreadChoice:
    """The engine kwarg ``num_threads`` if set, else ``telescope.core.cluster.threads``' rule."""
    if kwargs.num_threads:
        return ThreadChoice(kwargs.num_threads, "inference_engine_kwargs.num_threads")
    return choose_torch_threads(cfg, "inference")


def load_server_state(cfg: TelescopeConfig, kwargs: TransformersEngineKwargs, index: int = 0) -> ServerState:
    """Load model and tokenizer of ``cfg.model`` and start the generation loop."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from telescope.core.models.tiny import resolve_model_path

    check_config(cfg)
    threads = server_threads(cfg, kwargs)
    torch.set_num_threads(threads.threads)
    log.info("torch threads: %d (%s)", threads.threads, threads.rule)
    device = kwargs.device if kwargs.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda":
        torch.cuda.set_per_process_memory_fraction(cfg.gpu_memory_utilization)
    for note in _notes(cfg, device):
        log.info(note)
    path = resolve_model_path(cfg.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    dtype = getattr(torch, serving_dtype(cfg))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)  # type: ignore[arg-type]
    if cfg.lora_rank > 0:  # the trainer's adapters (zero update until the first sync) on the base model
        from telescope.core.weights.lora import inject_lora

        inject_lora(model, cfg)
        model.eval()
    positions = getattr(model.config, "max_position_embeddings", None)
    if positions is not None and cfg.max_model_len > positions:
        raise ValueError(
            f"max_model_len: {cfg.max_model_len} exceeds the {positions} positions of model {cfg.model!r}; "
            f"set max_model_len <= {positions}"
        )
    eos = model.generation_config.eos_token_id
    eos_ids = {eos} if isinstance(eos, int) else set(eos or ())
    if tokenizer.eos_token_id is not None:
        eos_ids.add(tokenizer.eos_token_id)
    options = EngineOptions(
        max_num_seqs=kwargs.max_num_seqs,
        max_model_len=cfg.max_model_len,
        scheduling_policy=cfg.vllm_scheduling_policy,
        seed=cfg.seed + index,
        eos_token_ids=frozenset(eos_ids),
        simulated_decode_step_s=kwargs.simulated_decode_step_s,
    )
    engine = GenerationEngine(model, options)
    sync = ServerWeightSync(
        engine,
        verify=cfg.weight_sync_verify,
        adapter_only=cfg.lora_rank > 0,
        skip_versions=kwargs.fault_skip_weight_syncs,
    )
    return ServerState(engine, tokenizer, options, sync, cfg.model, int(model.config.vocab_size))


async def _start_site(state: ServerState, host: str, port: int) -> web.AppRunner:
    runner = web.AppRunner(build_app(state, bound_host=host), handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


class InProcessServer:
    """A real HTTP server on its own event-loop thread inside this process."""

    def __init__(self, state: ServerState, host: str, port: int) -> None:
        self.state = state
        self.url = f"http://{host}:{port}"
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(host, port), daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError(f"in-process inference server on {host}:{port} did not start")

    def _run(self, host: str, port: int) -> None:
        asyncio.set_event_loop(self._loop)
        self._runner = self._loop.run_until_complete(_start_site(self.state, host, port))
        self._ready.set()
        self._loop.run_forever()

    def stop(self) -> None:
        """Stop serving and stop the generation loop."""
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self.state.engine.stop()


def start_in_thread(
    cfg: TelescopeConfig,
    kwargs: TransformersEngineKwargs | None = None,
    *,
    host: str = "127.0.0.1",
    port: int,
    index: int = 0,
) -> InProcessServer:
    """Load the model and serve it on ``host:port`` from a background thread (this process holds the
    run's secret its clients send: made here when absent)."""
    from telescope.core.cluster.run_secret import ensure_run_secret

    ensure_run_secret()
    return InProcessServer(load_server_state(cfg, kwargs or TransformersEngineKwargs(), index), host, port)


def main(argv: list[str] | None = None) -> None:
    """Entry point of a server process."""
    parser = argparse.ArgumentParser(description="Telescope transformers inference server")
    parser.add_argument("--config", required=True, help="path of the resolved run config (JSON)")
    parser.add_argument("--engine-kwargs", default="{}", help="TransformersEngineKwargs as JSON")
    parser.add_argument("--index", type=int, default=0, help="server index (seeds sampling)")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    from telescope.core.inference.parent_watch import exit_with_parent

    exit_with_parent()
    from telescope.core.cluster.run_secret import current_run_secret

    secret = current_run_secret()  # before loading the model: a server without one never starts
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with open(args.config) as fh:
        cfg = TelescopeConfig.model_validate(json.load(fh))
    kwargs = TransformersEngineKwargs.model_validate_json(args.engine_kwargs)
    state = load_server_state(cfg, kwargs, args.index)
    log.info("serving %s on %s:%d (server %d)", cfg.model, args.host, args.port, args.index)
    app = build_app(state, secret=secret, bound_host=args.host)
    quiet = server_logging(app, access_log=cfg.inference_access_log)  # a summary line per minute when off
    web.run_app(app, host=args.host, port=args.port, handler_cancellation=True, print=None, **quiet)


if __name__ == "__main__":
    main()
