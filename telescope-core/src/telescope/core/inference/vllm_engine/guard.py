"""``TelescopeGuard``: the door of a ``vllm serve`` a run starts (``--middleware``, outermost).

vLLM's own ``--api-key`` (given as ``VLLM_API_KEY``, never on the command line) covers only paths
under ``/v1``; ``/pause``, ``/resume``, ``/collective_rpc``, ``/sleep``, ``/invocations`` and the
rest need ``VLLM_SERVER_DEV_MODE=1`` and are then open to anyone. So the run launches vLLM *without*
dev mode and this ASGI middleware, which sees every request before vLLM routes it:

- refuses what ``cluster.http_guard`` refuses (foreign Host 421, no run secret 401 on every path but
  ``/health``, a POST that is not JSON 415), websockets included;
- serves the control routes the run needs itself, through vLLM's engine client
  (``app.state.engine_client``): ``POST /pause?mode=&clear_cache=``, ``POST /resume``,
  ``GET /is_paused`` and ``POST /telescope/collective_rpc``, which calls only the methods of
  Telescope's worker extension (``telescope_*``), never an arbitrary worker method;
- LoRA runs: ``POST /telescope/lora/load`` (``{"lora_name", "lora_path"}``) (re)loads the run's adapter
  in place through vLLM's ``OpenAIServingModels.load_lora_adapter`` (``app.state.openai_serving_models``),
  without vLLM's runtime-LoRA routes (``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` stays off).

Everything the contract tests check against vLLM's source (tests/inference/test_vllm_contract.py):
``--middleware`` classes are added last (outermost), the engine client's method signatures, that
vLLM's own control routes exist only in dev mode. No vLLM import here: it runs inside vLLM's server.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from telescope.core.cluster.http_guard import refusal
from telescope.core.cluster.run_secret import current_run_secret

__all__ = ["BOUND_HOST_ENV", "LORA_LOAD_PATH", "RPC_PATH", "RPC_PREFIX", "TelescopeGuard"]

#: Path of the worker-extension calls (vLLM's dev-mode ``/collective_rpc`` is never enabled).
RPC_PATH = "/telescope/collective_rpc"
#: Path of the LoRA adapter (re)load (``lora_rank > 0``).
LORA_LOAD_PATH = "/telescope/lora/load"
#: Only worker-extension methods with this prefix can be called (``vllm_engine.worker``).
RPC_PREFIX = "telescope_"
#: The address the server is bound to (set by ``VllmEngine.server_command``): a Host it answers to.
BOUND_HOST_ENV = "TELESCOPE_SERVER_HOST"
#: Largest body of a control request read (an RPC's arguments are a short JSON string).
MAX_CONTROL_BODY = 1 << 20

PAUSE_MODES = ("abort", "wait", "keep")

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class _BadRequest(ValueError):
    """A control request the guard answers with 400."""


class TelescopeGuard:
    """Pure ASGI middleware (vLLM adds it with ``app.add_middleware(TelescopeGuard)``)."""

    def __init__(self, app: Any, secret: str | None = None, bound_host: str | None = None) -> None:
        self.app = app
        self.secret = secret if secret is not None else current_run_secret()
        self.bound_host = bound_host if bound_host is not None else os.environ.get(BOUND_HOST_ENV, "")
        self.routes: dict[tuple[str, str], Callable[[Any, dict[str, list[str]], bytes], Awaitable[Any]]] = {
            ("POST", "/pause"): self._pause,
            ("POST", "/resume"): self._resume,
            ("GET", "/is_paused"): self._is_paused,
            ("POST", RPC_PATH): self._rpc,
            ("POST", LORA_LOAD_PATH): self._load_lora,
        }

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan
            await self.app(scope, receive, send)
            return
        headers: dict[str, str] = {}
        for name, value in scope.get("headers", []):
            headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
        path = str(scope.get("path", "/"))
        root = str(scope.get("root_path", "") or "")
        if root and path.startswith(root):
            path = path[len(root) :] or "/"
        method = "GET" if scope["type"] == "websocket" else str(scope.get("method", "GET")).upper()
        refused = refusal(
            method,
            path,
            lambda name: headers.get(name.lower()),
            secret=self.secret,
            bound_host=self.bound_host,
            open_paths=("/health",),
            what="this vLLM server",
        )
        if refused is not None:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008, "reason": refused.message[:120]})
            else:
                await _json(send, refused.status, {"error": refused.message}, refused.headers)
            return
        route = self.routes.get((method, path)) if scope["type"] == "http" else None
        if route is None:
            await self.app(scope, receive, send)
            return
        try:
            body = await _read_body(receive)
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            status, answer = 200, await route(scope["app"].state, query, body)
        except _BadRequest as exc:
            status, answer = 400, {"error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - the caller gets the worker's error, as from vLLM's route
            status, answer = 500, {"error": f"{type(exc).__name__}: {exc}"}
        await _json(send, status, answer)

    async def _pause(self, state: Any, query: dict[str, list[str]], body: bytes) -> Any:
        engine = state.engine_client
        mode = _one(query, "mode", "abort")
        if mode not in PAUSE_MODES:
            raise _BadRequest(f"/pause mode={mode!r}: use one of {', '.join(PAUSE_MODES)}")
        clear_cache = _flag(query, "clear_cache", True)
        await engine.pause_generation(mode=mode, clear_cache=clear_cache)
        return {"status": "paused"}

    async def _resume(self, state: Any, query: dict[str, list[str]], body: bytes) -> Any:
        engine = state.engine_client
        await engine.resume_generation()
        return {"status": "resumed"}

    async def _is_paused(self, state: Any, query: dict[str, list[str]], body: bytes) -> Any:
        engine = state.engine_client
        return {"is_paused": bool(await engine.is_paused())}

    async def _rpc(self, state: Any, query: dict[str, list[str]], body: bytes) -> Any:
        engine = state.engine_client
        try:
            request = json.loads(body or b"{}")
        except ValueError as exc:
            raise _BadRequest(f"{RPC_PATH}: the body is not JSON ({exc})") from None
        method = request.get("method") if isinstance(request, dict) else None
        if not isinstance(method, str) or not method.startswith(RPC_PREFIX):
            raise _BadRequest(
                f"{RPC_PATH}: method {method!r} refused: only Telescope's worker-extension methods "
                f"({RPC_PREFIX}*) can be called"
            )
        args, kwargs = request.get("args", []), request.get("kwargs", {})
        if not (isinstance(args, list) and all(isinstance(a, str) for a in args)) or not (
            isinstance(kwargs, dict) and all(isinstance(v, str) for v in kwargs.values())
        ):
            raise _BadRequest(f"{RPC_PATH}: args must be a list of strings and kwargs a dict of strings")
        timeout = request.get("timeout")
        results = await engine.collective_rpc(method=method, timeout=timeout, args=tuple(args), kwargs=kwargs)
        return {"results": [r if r is None or isinstance(r, dict | list) else str(r) for r in results or []]}

    async def _load_lora(self, state: Any, query: dict[str, list[str]], body: bytes) -> Any:
        """Load the run's adapter from ``lora_path`` under ``lora_name``, replacing the one loaded (in place:
        same name, same id, so requests naming it, in flight ones included, get the new weights)."""
        try:
            request = json.loads(body or b"{}")
        except ValueError as exc:
            raise _BadRequest(f"{LORA_LOAD_PATH}: the body is not JSON ({exc})") from None
        name = request.get("lora_name") if isinstance(request, dict) else None
        path = request.get("lora_path") if isinstance(request, dict) else None
        if not (isinstance(name, str) and name and isinstance(path, str) and path):
            raise _BadRequest(
                f"{LORA_LOAD_PATH}: send {{'lora_name': str, 'lora_path': str}}, got {request!r}"
            )
        models = getattr(state, "openai_serving_models", None)
        if models is None:
            raise _BadRequest(
                f"{LORA_LOAD_PATH}: this vLLM server serves no models API (openai_serving_models)"
            )
        answer = await models.load_lora_adapter(_LoadLoRA(lora_name=name, lora_path=path, load_inplace=True))
        if not isinstance(answer, str):  # vLLM's ErrorResponse
            error = getattr(answer, "error", answer)
            raise RuntimeError(
                f"vLLM refused LoRA adapter {name!r} from {path}: {getattr(error, 'message', error)} "
                "(is the server launched with --enable-lora and a --max-lora-rank >= lora_rank?)"
            )
        # vLLM keeps the request it loaded with as the adapter's request, load_inplace included, and
        # its worker reloads an adapter from disk at every step while its request says load_inplace:
        # clear it, so requests use the loaded weights until the next sync.
        loaded = models.lora_requests.get(name)
        if loaded is None or loaded.lora_path != path:
            raise RuntimeError(
                f"vLLM answered {answer!r} but serves LoRA adapter {name!r} from "
                f"{getattr(loaded, 'lora_path', None)!r}, not {path!r}: requests would sample another adapter"
            )
        loaded.load_inplace = False
        return {"status": answer, "lora_name": name, "lora_int_id": getattr(loaded, "lora_int_id", None)}


@dataclass
class _LoadLoRA:
    """vLLM's ``LoadLoRAAdapterRequest`` as every supported release defines it, without importing vLLM
    here: ``load_lora_adapter`` reads its fields as attributes (the contract tests check that this has
    each field the release defines, with its default, and that it reads no other)."""

    lora_name: str
    lora_path: str
    load_inplace: bool = True
    """Replace the loaded adapter under the same name and id (vLLM's default: false)."""
    is_3d_lora_weight: bool = False
    """vLLM's default; read by newer releases (0.33): adapters of fused MoE experts stored as 3D tensors,
    which peft's adapters of the run never are."""


def _one(query: dict[str, list[str]], name: str, default: str) -> str:
    values = query.get(name)
    return values[-1] if values else default


def _flag(query: dict[str, list[str]], name: str, default: bool) -> bool:
    raw = _one(query, name, "true" if default else "false").lower()
    if raw not in ("true", "false", "1", "0"):
        raise _BadRequest(f"{name}={raw!r}: send true or false")
    return raw in ("true", "1")


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_CONTROL_BODY:
            raise _BadRequest(f"a control request's body is limited to {MAX_CONTROL_BODY} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def _json(send: Send, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
    body = json.dumps(payload).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
