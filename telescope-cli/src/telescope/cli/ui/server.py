"""The ``telescope ui`` HTTP server (aiohttp, as the transformers engine's server): JSON
endpoints over a ``Workspace`` and the static page.

Data calls run in a worker thread, one at a time (the stores follow files with byte offsets
and are not shared between threads), so the event loop keeps serving static files and polls.
Plotly comes from the installed ``plotly`` package (the ``ui`` extra), never from a CDN.
"""

from __future__ import annotations

import asyncio
import importlib.util
import ipaddress
import json
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from telescope.cli.ui.conversation import conversation
from telescope.cli.ui.data import RunData, Workspace
from telescope.cli.ui.layouts import LayoutError, LayoutStore
from telescope.cli.ui.rollouts import RolloutFilter
from telescope.core.cluster.http_guard import ALLOWED_HOSTS_ENV, host_allowed

__all__ = ["ServerThread", "build_app", "plotly_js_path"]

STATIC_DIR = Path(__file__).parent / "static"
WORKSPACE: web.AppKey[Workspace] = web.AppKey("workspace", Workspace)
LOCK: web.AppKey[threading.Lock] = web.AppKey("lock", threading.Lock)
WARM_STOP: web.AppKey[threading.Event] = web.AppKey("warm_stop", threading.Event)


class Activity:
    """Counts the data calls in flight, so background indexing runs only while the server is quiet.

    Without it the warming thread re-took the data lock between its chunks ahead of waiting
    requests (locks are not fair): a 5 ms metrics query took 250 ms while a big run was indexed.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy = 0
        self._last_end = 0.0

    def enter(self) -> None:
        with self._lock:
            self._busy += 1

    def leave(self) -> None:
        with self._lock:
            self._busy -= 1
            self._last_end = time.monotonic()

    def quiet(self, for_s: float) -> bool:
        """No call in flight, and none ended within the last ``for_s`` seconds."""
        with self._lock:
            return self._busy == 0 and time.monotonic() - self._last_end >= for_s


ACTIVITY: web.AppKey[Activity] = web.AppKey("activity", Activity)


class BadRequest(ValueError):
    """A query the server refuses with HTTP 400 (the message says what to change)."""


def plotly_js_path() -> Path | None:
    """``plotly.min.js`` of the installed plotly package, or None when plotly is missing."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "package_data" / "plotly.min.js"
    return path if path.exists() else None


def _query_number(request: web.Request, name: str, kind: type[int] | type[float], what: str) -> Any:
    """Query parameter ``name`` as ``kind``, None when absent or empty; a clear 400 when it is not one."""
    raw = request.query.get(name, "")
    if raw == "":
        return None
    try:
        return kind(raw)
    except ValueError:
        raise BadRequest(f"query parameter {name}={raw!r} is not {what}") from None


def _int(request: web.Request, name: str, default: int | None = None) -> int | None:
    value = _query_number(request, name, int, "an integer")
    return default if value is None else int(value)


def _float(request: web.Request, name: str) -> float | None:
    value: float | None = _query_number(request, name, float, "a number")
    return value


async def _call(request: web.Request, fn: Callable[[], Any]) -> web.Response:
    lock, activity = request.app[LOCK], request.app[ACTIVITY]

    def locked() -> Any:
        with lock:
            return fn()

    activity.enter()

    try:
        result = await asyncio.get_running_loop().run_in_executor(None, locked)
    except (BadRequest, LayoutError) as exc:
        return web.json_response({"error": str(exc)}, status=400)
    except KeyError as exc:
        return web.json_response({"error": str(exc.args[0] if exc.args else exc)}, status=404)
    except ValueError as exc:
        return web.json_response({"error": str(exc)}, status=400)
    finally:
        activity.leave()
    return web.json_response(result, dumps=_dumps)


def _dumps(value: Any) -> str:
    """Strict JSON (browsers reject NaN): the cleaning pass runs only when a non-finite float is present."""
    try:
        return json.dumps(value, default=str, allow_nan=False)
    except ValueError:
        return json.dumps(_clean(value), default=str)


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _run(request: web.Request) -> RunData:
    return request.app[WORKSPACE].get(request.match_info["run"])


async def runs(request: web.Request) -> web.Response:
    ws = request.app[WORKSPACE]
    return await _call(request, lambda: {"runs": [r.summary() for r in ws.runs()], "errors": ws.errors})


async def poll(request: web.Request) -> web.Response:
    ws = request.app[WORKSPACE]
    return await _call(request, lambda: {"runs": {r.key: r.revisions() for r in ws.runs()}})


async def config(request: web.Request) -> web.Response:
    return await _call(request, lambda: {"config": _run(request).config(), "meta": _run(request).meta})


async def catalog(request: web.Request) -> web.Response:
    return await _call(request, lambda: _run(request).catalog())


async def metrics(request: web.Request) -> web.Response:
    keys = [k for k in request.query.get("keys", "").split(",") if k]

    def query() -> Any:
        run = _run(request)
        return run.metric_series(sorted(run.metrics.keys) if keys == ["*"] else keys)

    return await _call(request, query)


def _filter(request: web.Request) -> RolloutFilter:
    return RolloutFilter(
        env=request.query.get("env") or None,
        outcome=request.query.get("outcome") or None,
        reward_min=_float(request, "reward_min"),
        reward_max=_float(request, "reward_max"),
        advantage_min=_float(request, "adv_min"),
        advantage_max=_float(request, "adv_max"),
        length_min=_int(request, "len_min"),
        length_max=_int(request, "len_max"),
        text=request.query.get("q") or None,
        group_id=_int(request, "group"),
        tag=request.query.get("tag") or None,
    )


async def rollouts(request: web.Request) -> web.Response:
    def query() -> Any:
        run = _run(request)
        out = run.rollout_query(
            _int(request, "step"),
            _filter(request),
            limit=_int(request, "limit", 200) or 200,
            offset=_int(request, "offset", 0) or 0,
            sort=request.query.get("sort", ""),
        )
        out["steps"] = run.rollout_steps()
        return out

    return await _call(request, query)


async def sample(request: web.Request) -> web.Response:
    def query() -> Any:
        step, gid, sid = _int(request, "step"), _int(request, "group"), _int(request, "sample")
        if step is None or gid is None or sid is None:
            raise BadRequest("sample needs step, group and sample query parameters")
        record = _run(request).sample(step, gid, sid)
        if record is None:
            raise KeyError(f"no rollout step={step} group={gid} sample={sid}")
        return {"record": record, "conversation": conversation(record)}

    return await _call(request, query)


async def group(request: web.Request) -> web.Response:
    def query() -> Any:
        step, gid = _int(request, "step"), _int(request, "group")
        if step is None or gid is None:
            raise BadRequest("group needs step and group query parameters")
        rows = _run(request).group(step, gid)
        return {"rows": [{"record": r, "conversation": conversation(r)} for r in rows]}

    return await _call(request, query)


async def timeline(request: web.Request) -> web.Response:
    def query() -> Any:
        run = _run(request)
        steps = run.metrics.steps() or run.events.steps()
        last = steps[-1] if steps else 0
        hi = _int(request, "to", last)
        lo = _int(request, "from", hi)
        assert lo is not None and hi is not None
        return run.timeline(lo, hi)

    return await _call(request, query)


async def sandboxes(request: web.Request) -> web.Response:
    return await _call(request, lambda: _run(request).sandboxes(_int(request, "step")))


async def system(request: web.Request) -> web.Response:
    return await _call(request, lambda: _run(request).system_series())


async def evals(request: web.Request) -> web.Response:
    return await _call(request, lambda: _run(request).eval_records())


async def eval_samples(request: web.Request) -> web.Response:
    def query() -> Any:
        step = _int(request, "step")
        if step is None or not request.query.get("name"):
            raise BadRequest("eval_samples needs name and step query parameters")
        return {"rows": _run(request).eval_samples(request.query["name"], step)}

    return await _call(request, query)


async def logs(request: web.Request) -> web.Response:
    components = [c for c in request.query.get("components", "").split(",") if c] or None
    return await _call(
        request,
        lambda: _run(request).logs.query(
            components=components,
            level=request.query.get("level") or None,
            text=request.query.get("q") or None,
            after=_int(request, "after", 0) or 0,
            limit=_int(request, "limit", 500) or 500,
        ),
    )


class Refused(Exception):
    """A state-changing request refused before it is read (status and the reason)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


#: Host names that name this server when it listens on a loopback or wildcard address.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


def check_state_change(request: web.Request) -> None:
    """A state-changing route answers only a loopback client sending JSON with a Host header that
    names this server: another machine, a form post from a web page (no JSON content type without
    a CORS preflight, which is not answered) and DNS rebinding (a foreign host name) are refused."""
    remote = request.remote or ""
    try:
        loopback = ipaddress.ip_address(remote.split("%")[0]).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise Refused(
            403, f"client {remote or '?'} is not on this machine: layouts are changed from loopback only"
        )
    if request.content_type != "application/json":
        raise Refused(415, f"content type {request.content_type!r} refused: send application/json")
    sock = request.transport.get_extra_info("sockname") if request.transport else None
    port = str(sock[1]) if sock else ""
    bound = str(sock[0]) if sock else ""
    names = {f"{n}:{port}" for n in (*LOOPBACK_NAMES, bound if ":" not in bound else f"[{bound}]")}
    if request.host not in names:
        raise Refused(
            403,
            f"Host {request.host!r} does not name this server (expected one of {', '.join(sorted(names))})",
        )


async def _state_change(request: web.Request, fn: Callable[[Any], Any]) -> web.Response:
    try:
        check_state_change(request)
        body = await request.json()
    except Refused as exc:
        return web.json_response({"error": str(exc)}, status=exc.status)
    except ValueError:
        return web.json_response({"error": "the body is not JSON: send a JSON object"}, status=400)
    if not isinstance(body, dict):
        return web.json_response({"error": "the body must be a JSON object"}, status=400)
    return await _call(request, lambda: fn(body))


def _layouts(request: web.Request) -> LayoutStore:
    return LayoutStore(request.app[WORKSPACE].paths[0])


async def layout_get(request: web.Request) -> web.Response:
    store = _layouts(request)
    return await _call(
        request, lambda: {"sections": store.load(), "exported": store.exported(), "path": str(store.dir)}
    )


async def layout_put(request: web.Request) -> web.Response:
    store = _layouts(request)
    return await _state_change(request, lambda body: {"sections": store.save(body.get("sections"))})


async def layout_export(request: web.Request) -> web.Response:
    store = _layouts(request)
    return await _state_change(
        request, lambda body: {"path": str(store.export(body.get("name"))), "exported": store.exported()}
    )


async def layout_import(request: web.Request) -> web.Response:
    store = _layouts(request)
    return await _state_change(request, lambda body: {"sections": store.import_(body.get("name"))})


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC_DIR / "index.html")


async def plotly_js(request: web.Request) -> web.StreamResponse:
    path = plotly_js_path()
    if path is None:
        return web.Response(
            text="console.error('plotly is not installed: pip install \"telescope-cli[ui]\"');",
            content_type="application/javascript",
        )
    return web.FileResponse(path, headers={"Cache-Control": "max-age=86400"})


#: Warming waits this long after the last data call (a page's first requests come in a burst).
QUIET_S = 0.25
#: Bytes indexed per lock hold while warming: a request arriving meanwhile waits for one chunk.
WARM_CHUNK = 2 * 1024 * 1024


def warm_indexes(
    workspace: Workspace,
    lock: threading.Lock,
    stop: threading.Event,
    delay_s: float = 0.5,
    activity: Activity | None = None,
) -> None:
    """Index every run's rollout and event files in the background, one chunk per lock hold, so
    the first Rollouts or Timeline request of a big run finds its step already indexed; each
    chunk waits until no request is in flight (``activity``), so pages are answered first."""
    if stop.wait(delay_s):
        return

    def wait_quiet() -> bool:
        while activity is not None and not activity.quiet(QUIET_S):
            if stop.wait(0.05):
                return False
        return not stop.is_set()

    for run in workspace.runs():
        if not wait_quiet():
            return
        with lock:
            indexes = run.rollouts.all_indexes() + run.events.all_indexes()
        for index in indexes:
            more = True
            while more and wait_quiet():
                with lock:
                    index.refresh(max_chunks=1, chunk_bytes=WARM_CHUNK)
                    # an unfinished last line (a run killed mid-write) stays pending until it is
                    # completed: warming it again would spin on the same bytes forever
                    more = index.pending() and not index.torn_tail


async def _start_warming(app: web.Application) -> None:
    stop = threading.Event()
    app[WARM_STOP] = stop
    threading.Thread(
        target=warm_indexes,
        args=(app[WORKSPACE], app[LOCK], stop),
        kwargs={"activity": app[ACTIVITY]},
        name="ui-warm",
        daemon=True,
    ).start()


async def _stop_warming(app: web.Application) -> None:
    app[WARM_STOP].set()


@web.middleware
async def named_host_only(request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
    """Every route answers only a Host that names this server: localhost, an address (which cannot be
    rebound), the bound address or a name in TELESCOPE_ALLOWED_HOSTS. A web page whose DNS name was
    rebound to this machine sends its own name and is refused (421) before anything is read."""
    sock = request.transport.get_extra_info("sockname") if request.transport else None
    bound = str(sock[0]) if sock else ""
    host = request.headers.get("Host")
    if not host_allowed(host, bound):
        return web.json_response(
            {
                "error": f"Host {host!r} does not name this dashboard: open it as localhost or by address, "
                f"or list the name in {ALLOWED_HOSTS_ENV} (a foreign host name is how DNS rebinding looks)"
            },
            status=421,
        )
    response: web.StreamResponse = await handler(request)
    return response


def build_app(workspace: Workspace, *, warm: bool = True) -> web.Application:
    """The dashboard's routes; ``warm`` indexes big runs' rollouts and events in the background."""
    app = web.Application(middlewares=[named_host_only])
    app[WORKSPACE] = workspace
    app[LOCK] = threading.Lock()
    app[ACTIVITY] = Activity()
    if warm:
        app.on_startup.append(_start_warming)
        app.on_cleanup.append(_stop_warming)
    app.router.add_get("/", index)
    app.router.add_get("/vendor/plotly.min.js", plotly_js)
    app.router.add_static("/static/", STATIC_DIR)
    app.router.add_get("/api/runs", runs)
    app.router.add_get("/api/poll", poll)
    app.router.add_get("/api/layout", layout_get)
    app.router.add_put("/api/layout", layout_put)
    app.router.add_post("/api/layout/export", layout_export)
    app.router.add_post("/api/layout/import", layout_import)
    for name, handler in (
        ("config", config),
        ("catalog", catalog),
        ("metrics", metrics),
        ("rollouts", rollouts),
        ("sample", sample),
        ("group", group),
        ("timeline", timeline),
        ("system", system),
        ("sandboxes", sandboxes),
        ("evals", evals),
        ("eval_samples", eval_samples),
        ("logs", logs),
    ):
        app.router.add_get(f"/api/runs/{{run}}/{name}", handler)
    return app


class ServerThread:
    """The dashboard server on a background thread (tests and the benchmark)."""

    def __init__(self, workspace: Workspace, host: str = "127.0.0.1", port: int = 0) -> None:
        self.workspace, self.host, self.port = workspace, host, port
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="telescope-ui", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        self._runner = web.AppRunner(build_app(self.workspace), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    def start(self) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("telescope ui server did not start within 30 s")
        return self

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
