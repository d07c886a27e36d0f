"""``telescope serve``: one engine server behind a gateway, outside any run.

The target is a run config (its model, engine and chat settings), a Hugging Face model folder or
hub name, or a native Telescope checkpoint (converted to a Hugging Face folder for the engine). The
engine runs as its own process on a free loopback port; the gateway listens on ``host:port`` in
this process and needs the run secret on every ``/v1`` route.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from telescope.core.config import TelescopeConfig, load_config
from telescope.core.inference.gateway.chat import ToolCallParser

__all__ = ["ServeOptions", "serve", "serve_config"]


@dataclass(frozen=True)
class ServeOptions:
    """What ``telescope serve`` takes besides the target."""

    host: str = "127.0.0.1"
    port: int = 8000
    engine: str | None = None
    tool_call_parser: ToolCallParser | None = None
    """None: the run config's ``agent_tool_call_parser``."""
    served_model_name: str | None = None
    max_tokens: int = 1024


def serve_config(
    target: str, overrides: list[str], registry: Any, engine: str | None = None
) -> TelescopeConfig:
    """The config to serve ``target`` with: a run YAML with ``overrides``, or the defaults with
    ``model: target``; one server (``inference_num_workers`` = its tensor-parallel size)."""
    path = Path(target)
    extra: dict[str, Any] = {}
    if engine is not None:
        extra["inference_engine"] = engine
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise FileNotFoundError(
                f"run config {target} does not exist; give a run YAML, a model folder or a checkpoint"
            )
        cfg = load_config(path, overrides, registry)
    else:
        # a run config needs an environment; serving never uses it
        base = {"model": target, "environments": [{"name": "reverse_text"}]}
        cfg = load_config(None, {**base, **_parsed(overrides)}, registry)
    extra["inference_num_workers"] = cfg.inference_tensor_parallel_size
    return cfg.model_copy(update=extra)


def _parsed(overrides: list[str]) -> dict[str, Any]:
    from telescope.core.config import field_names
    from telescope.core.config.loader import parse_overrides

    return parse_overrides(list(overrides), field_names())


@contextlib.contextmanager
def _model_folder(model: str) -> Iterator[str]:
    """``model`` itself, or a native checkpoint converted into a temporary Hugging Face folder."""
    from telescope.core.checkpoint.layout import is_native_checkpoint

    if not is_native_checkpoint(model):
        yield model
        return
    from telescope.core.checkpoint.convert import convert_checkpoint

    with tempfile.TemporaryDirectory(prefix="telescope-serve-") as tmp:
        yield str(convert_checkpoint(model, Path(tmp) / "hf"))


async def serve(
    cfg: TelescopeConfig,
    registry: Any,
    options: ServeOptions,
    secret: str,
    *,
    on_ready: Callable[[str, str], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Start the engine and the gateway; call ``on_ready(base_url, engine_log)``; serve until ``stop`` is
    set (or the task is cancelled: Ctrl-C); then stop both."""
    from transformers import AutoTokenizer

    from telescope.core.inference.auto import resolve_inference_engine
    from telescope.core.inference.gateway.app import Gateway, GatewaySettings
    from telescope.core.inference.gateway.serve import start_gateway
    from telescope.core.models.tiny import resolve_model_path
    from telescope.core.weights.group import free_port

    engine_name, _ = resolve_inference_engine(cfg.inference_engine)
    name = options.served_model_name or cfg.model
    with _model_folder(cfg.model) as folder:
        cfg = cfg.model_copy(update={"model": folder})
        engine = registry.create("inference_engine", engine_name, cfg.inference_engine_kwargs, cfg=cfg)
        log_dir = tempfile.mkdtemp(prefix="telescope-serve-logs-")
        server = await asyncio.to_thread(
            engine.launch, 0, host="127.0.0.1", port=free_port(), log_dir=log_dir, wait=False
        )
        try:
            await asyncio.to_thread(server.wait_ready, engine.kwargs.startup_timeout_s)
            path = resolve_model_path(cfg.model)
            tokenizer = await asyncio.to_thread(lambda: AutoTokenizer.from_pretrained(path))
            settings = GatewaySettings.from_config(
                cfg,
                served_model_name=name,
                max_tokens=options.max_tokens,
                tool_call_parser=options.tool_call_parser or cfg.agent_tool_call_parser,
            )
            gateway = Gateway(engine.client(server.url), tokenizer, settings, secret=secret)
            runner, url = await start_gateway(gateway, options.host, options.port)
            try:
                if on_ready is not None:
                    on_ready(url, str(server.log_path))
                await (stop or asyncio.Event()).wait()
            finally:
                await runner.cleanup()
                await gateway.client.close()
        finally:
            await asyncio.to_thread(server.stop, 5.0)
