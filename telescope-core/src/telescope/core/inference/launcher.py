"""Server processes shared by both engines: launch, wait for ``/health``, stop (no heavy imports).

``InferenceEngine`` is what an engine factory returns: it knows how many servers a run has,
the command that starts server ``i`` from the *resolved* config, and how to talk to one. The
orchestrator (or a Ray actor it places) calls ``launch(i, ...)``; tests call it directly.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from telescope.core.config.secrets import redact_secrets
from telescope.core.inference.settings import num_servers, server_port
from telescope.core.observe.stdio import without_process_prefix

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["InferenceEngine", "ServerCommand", "ServerProcess", "ServerStartError", "cause_line"]


@dataclass(frozen=True)
class ServerCommand:
    """How to start one server."""

    argv: list[str]
    env: dict[str, str]
    url: str
    secret_env: dict[str, str] = field(default_factory=dict)
    """Variables set at launch from the run's secret: name -> template with ``{secret}`` (the value is
    never held here, so a logged command cannot leak it)."""


#: The last line of a Python traceback: ``ValueError: ...``, ``torch.OutOfMemoryError: ...``.
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")


def cause_line(lines: list[str]) -> str:
    """The line of a server log that says why it ended: its last exception line, else its last line.

    vLLM's processes prefix every line, tracebacks included, with ``(EngineCore_DP0 pid=N) ``."""
    for line in reversed(lines):
        bare = without_process_prefix(line)
        if _EXCEPTION_LINE.match(bare):
            return bare.strip()
    return next((line.strip() for line in reversed(lines) if line.strip()), "")


class ServerStartError(RuntimeError):
    """A server process ended before it was ready.

    The first line of the message carries the cause read from the server's log (a failed
    run reports only that line), the rest the log's last lines; ``log_tail`` keeps them too.
    """

    def __init__(self, message: str, log_tail: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.log_tail = tuple(log_tail)

    def __reduce__(self) -> tuple[Any, ...]:  # crosses Ray (pickled) with its log lines
        return (type(self), (str(self), self.log_tail))


def check_port_free(url: str) -> None:
    """Refuse to launch on a port something already listens on.

    Otherwise the new server would fail to bind while ``/health`` is answered by whatever holds
    the port (e.g. a server left over from another run), and the run would silently talk to it.
    """
    if _port_in_use(url):
        port = _host_port(url)[1]
        raise RuntimeError(
            f"port {port} ({url}) is already in use: another inference server (maybe left over from an "
            f"earlier run) or another program listens there. Stop it, or set inference_base_port to a free port"
        )


def wait_port_free(url: str, timeout_s: float, interval_s: float = 0.2) -> None:
    """Wait until nothing listens on ``url``'s port, then return; ``check_port_free``'s error after
    ``timeout_s``. A server just SIGKILLed closes its port only once its processes have exited: a
    large vLLM server (GiBs mapped) takes seconds to, a stopped one more."""
    deadline = time.monotonic() + timeout_s
    while _port_in_use(url) and time.monotonic() < deadline:
        time.sleep(interval_s)
    check_port_free(url)


def _host_port(url: str) -> tuple[str, int]:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", int(parts.port or 80)


def _port_in_use(url: str) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(_host_port(url)) == 0


class ServerProcess:
    """A running server process (its own session, so stopping it stops its children).

    It inherits this process's environment, the run's secret included (made here when this process
    has none: the server then answers this process's clients only); the secret is never an argument.
    """

    def __init__(self, command: ServerCommand, log_path: str | os.PathLike[str]) -> None:
        from telescope.core.cluster.run_secret import ensure_run_secret

        secret = ensure_run_secret()
        check_port_free(command.url)
        self.command = command
        self.url = command.url
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # kept open for the process lifetime
        self.process = subprocess.Popen(
            command.argv,
            env={
                **os.environ,
                **command.env,
                **{name: template.format(secret=secret) for name, template in command.secret_env.items()},
            },
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout_s: float, interval_s: float = 0.5) -> None:
        """Poll ``/health`` until 200; raise (with the log's tail) if the process exits or time runs out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise self._start_error()
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                    if resp.status == 200 and self.process.poll() is None:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(interval_s)
        self.stop()
        raise TimeoutError(
            f"inference server {self.url} not ready after {timeout_s:.0f}s; log: {self.log_path}"
        )

    def _start_error(self) -> ServerStartError:
        """The process exited: its cause, then the log's last lines."""
        tail = self.log_lines()
        cause = cause_line(tail) or "its log is empty"
        shown = "\n".join(tail) or "(no log lines)"
        return ServerStartError(
            f"inference server {self.url} exited with code {self.process.returncode} before it was ready: "
            f"{cause}\nlast log lines ({self.log_path}):\n{shown}",
            tuple(tail),
        )

    def log_lines(self, lines: int = 30) -> list[str]:
        """The last ``lines`` lines of the server's log, cleaned (empty when it cannot be read)."""
        from telescope.core.observe.stdio import tail_lines

        return tail_lines(self.log_path, lines)

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the server's log."""
        return "\n".join(self.log_lines(lines)) if self.log_path.exists() else "(no log)"

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL after ``grace_s``."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            except ProcessLookupError:
                pass
        self._log.close()


class InferenceEngine:
    """Base of the engine objects that the ``inference_engine`` factories return."""

    name = "base"
    #: Its servers keep a prefix cache and say its size in tokens on ``/metrics`` (vLLM's
    #: ``cache_config_info``): the ``sticky_least_loaded`` router reads it (``runtime.assemble.build_router``).
    prefix_cache_in_metrics = False
    #: Its servers answer ``GET /metrics`` in Prometheus text (vLLM): the run scrapes them into
    #: ``system.jsonl`` (``runtime.driver``).
    serves_prometheus_metrics = False
    #: Its servers export OTLP request spans to the run's receiver (vLLM, with ``enable_vllm_tracing``):
    #: the run starts the receiver before the servers (``runtime.driver``).
    exports_request_traces = False

    def __init__(self, cfg: TelescopeConfig, kwargs: Any) -> None:
        self.cfg = cfg
        self.kwargs = kwargs

    @property
    def num_servers(self) -> int:
        """Servers of the run (inference_num_workers / inference_tensor_parallel_size)."""
        return num_servers(self.cfg)

    @property
    def sync_ranks_per_server(self) -> int:
        """Members each server adds to the weight-sync group (one per process that receives)."""
        return 1

    def server_command(self, index: int, host: str, port: int, config_path: str) -> ServerCommand:
        """The command that starts server ``index`` (engine specific)."""
        raise NotImplementedError(f"{type(self).__name__}.server_command")

    def write_config(self, directory: str | os.PathLike[str] | None = None) -> str:
        """Write the resolved config as JSON (what every server process reads) and return its path.

        Secrets are redacted (``config.secrets``) as in config.yaml: the file lies in the run
        directory, which users upload and share, and no server reads a secret from it (the run's
        secret comes through the environment)."""
        directory = Path(directory or tempfile.mkdtemp(prefix="telescope-inference-"))
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "resolved_config.json"
        data = redact_secrets(self.cfg.to_dict() if hasattr(self.cfg, "to_dict") else dict(vars(self.cfg)))
        path.write_text(json.dumps(data, indent=1, default=str))
        return str(path)

    def launch(
        self,
        index: int,
        *,
        host: str | None = None,
        port: int | None = None,
        log_dir: str | None = None,
        config_path: str | None = None,
        wait: bool = True,
    ) -> ServerProcess:
        """Start server ``index`` (host/port default to inference_host and inference_base_port + index)."""
        host = host or self.cfg.inference_host
        port = port or server_port(self.cfg, index)
        log_dir = log_dir or os.path.join(self.cfg.resolved_run_dir, "logs", "inference")
        command = self.server_command(index, host, port, config_path or self.write_config(log_dir))
        server = ServerProcess(command, os.path.join(log_dir, f"server_{index}.log"))
        if wait:
            server.wait_ready(self.kwargs.startup_timeout_s)
        return server

    def client(self, url: str, **options: Any) -> Any:
        """An ``InferenceClient`` for one of this engine's servers."""
        from telescope.core.inference.client import InferenceClient

        return InferenceClient(url, **options)
