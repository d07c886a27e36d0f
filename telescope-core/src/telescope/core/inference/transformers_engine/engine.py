"""``TransformersEngine``: launches transformers-engine server processes from the resolved config."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from telescope.core.inference.launcher import InferenceEngine, ServerCommand
from telescope.core.inference.settings import TransformersEngineKwargs

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["TransformersEngine", "create_transformers_engine", "local_url"]


def local_url(host: str, port: int) -> str:
    """URL to reach a server bound to ``host`` from this node (a wildcard bind is reached on loopback)."""
    reach = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://{reach}:{port}"


class TransformersEngine(InferenceEngine):
    """The embedded engine: one ``python -m ...transformers_engine.server`` process per server."""

    name = "transformers"

    def __init__(self, cfg: TelescopeConfig, kwargs: TransformersEngineKwargs) -> None:
        from telescope.core.inference.transformers_engine.server import check_config

        check_config(cfg)  # fail at creation, before any process starts
        super().__init__(cfg, kwargs)

    def server_command(self, index: int, host: str, port: int, config_path: str) -> ServerCommand:
        """``python -m telescope.core.inference.transformers_engine.server`` with the resolved config file."""
        argv = [
            sys.executable,
            "-m",
            "telescope.core.inference.transformers_engine.server",
            "--config",
            config_path,
            "--engine-kwargs",
            self.kwargs.model_dump_json(),
            "--index",
            str(index),
            "--host",
            host,
            "--port",
            str(port),
        ]
        return ServerCommand(argv=argv, env={"PYTHONUNBUFFERED": "1"}, url=local_url(host, port))


def create_transformers_engine(
    *, kwargs: TransformersEngineKwargs, cfg: TelescopeConfig
) -> TransformersEngine:
    """Registry factory: ``registry.create("inference_engine", "transformers", {}, cfg=cfg)``."""
    return TransformersEngine(cfg, kwargs)
