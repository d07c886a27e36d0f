"""The aiohttp application of a transformers-engine server (routes of ``inference.protocol``)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from telescope.core.cluster.http_guard import refusal
from telescope.core.cluster.run_secret import current_run_secret
from telescope.core.inference.protocol import (
    ENDPOINTS,
    MAX_SEED,
    AbortRequest,
    CompletionRequest,
    WeightSyncInitRequest,
    WeightUpdateRequest,
)
from telescope.core.inference.transformers_engine.prompt_scoring import PromptTokenLogprob, score_prompts
from telescope.core.inference.transformers_engine.sampling import SamplingParams
from telescope.core.inference.transformers_engine.scheduler import RequestState, Sequence
from telescope.core.inference.transformers_engine.weights import ServerWeightSync
from telescope.core.weights.errors import WeightSyncError, WeightSyncMismatchError

__all__ = ["STATE", "build_app"]

#: Application key of the server's shared state.
STATE: web.AppKey[Any] = web.AppKey("state", object)


class BadRequest(ValueError):
    """A request the server refuses with HTTP 400 (the message says what to change)."""


def _error(status: int, message: str, kind: str = "BadRequest", **extra: Any) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, **extra}}, status=status)


def guard(secret: str, bound_host: str) -> Any:
    """Middleware refusing, before anything is read, a request with a foreign Host (421), without the run's
    secret (401; every route but ``/health``) or a POST that is not JSON (415): ``cluster.http_guard``.

    Generation needs the secret too: it takes the run's slots, accepts caller-chosen request ids (which
    would collide with the run's own) and serves the policy being trained.
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Any) -> web.StreamResponse:
        refused = refusal(
            request.method,
            request.path,
            request.headers.get,
            secret=secret,
            bound_host=bound_host,
            open_paths=(ENDPOINTS["health"],),
            what="this inference server",
        )
        if refused is not None:
            response = _error(refused.status, refused.message, "Refused")
            response.headers.update(refused.headers)
            return response
        return await handler(request)

    return middleware


def build_app(state: Any, *, secret: str | None = None, bound_host: str = "127.0.0.1") -> web.Application:
    """Routes over ``state`` (a ``ServerState``: engine, tokenizer, options, weight sync), answering only
    requests that carry ``secret`` (default: the run's, ``TELESCOPE_RUN_SECRET``; none is an error)."""
    secret = secret if secret is not None else current_run_secret()
    app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[guard(secret, bound_host)])
    app[STATE] = state
    app.router.add_post(ENDPOINTS["completions"], completions)
    app.router.add_get(ENDPOINTS["models"], models)
    app.router.add_get(ENDPOINTS["health"], health)
    app.router.add_get(ENDPOINTS["metrics"], metrics)
    app.router.add_post(ENDPOINTS["abort"], abort)
    app.router.add_post(ENDPOINTS["pause"], pause)
    app.router.add_post(ENDPOINTS["resume"], resume)
    app.router.add_get(ENDPOINTS["is_paused"], is_paused)
    app.router.add_post(ENDPOINTS["weights_init"], weights_init)
    app.router.add_post(ENDPOINTS["weights_update"], weights_update)
    app.router.add_get(ENDPOINTS["weights_version"], weights_version)
    return app


async def _parse(request: web.Request, model: Any) -> Any:
    try:
        return model.model_validate(await request.json() if request.can_read_body else {})
    except ValidationError as exc:
        raise BadRequest(f"invalid {model.__name__}: {exc}") from None
    except ValueError as exc:
        raise BadRequest(f"body is not JSON: {exc}") from None


#: Sequences one request may put in the queue (prompts x n).
MAX_SEQUENCES_PER_REQUEST = 4096
#: Characters of prompt text per token of ``max_model_len`` accepted before tokenizing (a token is a
#: few characters; a 60 MB prompt used to hold the event loop for minutes before being refused).
MAX_CHARS_PER_TOKEN = 32


def _prompt_items(state: Any, body: CompletionRequest) -> list[Any]:
    """The request's prompts, checked for count and text size before any tokenizing (cheap)."""
    raw = body.prompt
    if not raw:
        raise BadRequest("prompt is empty")
    items: list[Any] = [raw] if isinstance(raw, str) or isinstance(raw[0], int) else list(raw)
    if len(items) * body.n > MAX_SEQUENCES_PER_REQUEST:
        raise BadRequest(
            f"{len(items)} prompts x n={body.n} is {len(items) * body.n} sequences; at most "
            f"{MAX_SEQUENCES_PER_REQUEST} per request: split it into several requests"
        )
    max_chars = state.options.max_model_len * MAX_CHARS_PER_TOKEN
    for i, item in enumerate(items):
        if isinstance(item, str) and len(item) > max_chars:
            raise BadRequest(
                f"prompt {i} has {len(item)} characters; more than max_model_len "
                f"{state.options.max_model_len} tokens can hold (limit {max_chars} characters)"
            )
    if body.seed is not None and body.seed + len(items) * body.n > MAX_SEED:
        raise BadRequest(
            f"seed {body.seed} is too large for {len(items) * body.n} choices; use a seed below 2^62"
        )
    return items


def _prompts(state: Any, body: CompletionRequest, items: list[Any]) -> list[list[int]]:
    """Token ids of ``items`` (text is tokenized: run it off the event loop), checked against the model."""
    prompts: list[list[int]] = [
        state.tokenizer(p, add_special_tokens=False)["input_ids"] if isinstance(p, str) else list(p)
        for p in items
    ]
    limit = state.options.max_model_len
    for i, ids in enumerate(prompts):
        if not ids:
            raise BadRequest(f"prompt {i} is empty")
        if len(ids) >= limit:
            raise BadRequest(
                f"prompt {i} has {len(ids)} tokens; max_model_len is {limit} (leave room to generate)"
            )
        if max(ids) >= state.vocab_size or min(ids) < 0:
            raise BadRequest(f"prompt {i} has token ids outside [0, {state.vocab_size})")
    return prompts


def _check_supported(state: Any, body: CompletionRequest) -> None:
    if body.priority != 0 and state.options.scheduling_policy != "priority":
        raise BadRequest(
            "priority is set but vllm_scheduling_policy is 'fcfs'; set it to 'priority' or send priority 0"
        )


async def completions(request: web.Request) -> web.Response:
    """``POST /v1/completions``."""
    state = request.app[STATE]
    try:
        body = await _parse(request, CompletionRequest)
        _check_supported(state, body)
        items = _prompt_items(state, body)
        if any(isinstance(item, str) for item in items):  # tokenizing may take long: not on the loop
            prompts = await asyncio.to_thread(_prompts, state, body, items)
        else:
            prompts = _prompts(state, body, items)
    except BadRequest as exc:
        return _error(400, str(exc))
    request_id = body.request_id or f"cmpl-{uuid.uuid4().hex}"
    if state.engine.is_active(request_id):
        return _error(400, f"request_id {request_id!r} is already in flight; use a unique id")
    loop = asyncio.get_running_loop()
    done: asyncio.Future[RequestState] = loop.create_future()

    def on_done(finished: RequestState) -> None:  # runs on the generation thread
        loop.call_soon_threadsafe(_resolve, done, finished)

    req = RequestState(request_id, body.priority, on_done)
    params = SamplingParams(
        temperature=body.temperature,
        top_p=body.top_p or 1.0,
        max_tokens=body.max_tokens,
        stop_token_ids=frozenset(body.stop_token_ids or ()),
        seed=body.seed,
        ignore_eos=body.ignore_eos,
        top_logprobs=body.logprobs or 0,
        stop=(body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ()),
    )
    req.sequences = [
        Sequence(req, p * body.n + i, ids, params) for p, ids in enumerate(prompts) for i in range(body.n)
    ]
    state.engine.submit(req)
    try:
        await done
        scored = None if body.prompt_logprobs is None else await _score(state, prompts, body.prompt_logprobs)
    except asyncio.CancelledError:  # client went away: free the slots now
        state.engine.abort([request_id])
        raise
    return web.json_response(_response(state, body, req, scored))


async def _score(state: Any, prompts: list[list[int]], top: int) -> list[list[Any]]:
    """``prompt_logprobs`` of every prompt, computed on the generation loop's thread between steps."""
    model = state.engine.model
    return await asyncio.to_thread(state.engine.run_between_steps, lambda: score_prompts(model, prompts, top))


def _prompt_logprobs(scored: list[PromptTokenLogprob | None]) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's wire form: per position ``{"<id>": {"logprob", "rank"}}`` of the token and its alternatives."""
    out: list[dict[str, dict[str, Any]] | None] = []
    for entry in scored:
        if entry is None:
            out.append(None)
            continue
        row = {str(i): {"logprob": v, "rank": rank + 1} for rank, (i, v) in enumerate(entry.top)}
        row[str(entry.token_id)] = {"logprob": entry.logprob, "rank": entry.rank}
        out.append(row)
    return out


def _resolve(future: asyncio.Future[RequestState], req: RequestState) -> None:
    if not future.done():
        future.set_result(req)


def _response(
    state: Any, body: CompletionRequest, req: RequestState, scored: list[list[Any]] | None = None
) -> dict[str, Any]:
    choices = []
    for seq in req.sequences:
        choice: dict[str, Any] = {
            "index": seq.choice_index,
            "text": state.tokenizer.decode(seq.output_ids, skip_special_tokens=body.skip_special_tokens),
            "token_ids": seq.output_ids,
            "prompt_token_ids": seq.prompt_ids,
            "finish_reason": seq.finish_reason,
            "weight_versions": seq.weight_versions,
            "logprobs": None,
        }
        if scored is not None:
            choice["prompt_logprobs"] = _prompt_logprobs(scored[seq.choice_index // body.n])
        if body.logprobs is not None:  # token strings only when asked for: they cost a tokenizer call
            tokens = (
                [f"token_id:{t}" for t in seq.output_ids]
                if body.return_tokens_as_token_ids
                else state.tokenizer.convert_ids_to_tokens(seq.output_ids)
            )
            choice["logprobs"] = {
                "tokens": tokens,
                "token_logprobs": seq.logprobs,
                "top_logprobs": _top_logprobs(state, body, seq) if body.logprobs else None,
            }
        choices.append(choice)
    prompt_tokens = sum(len(s.prompt_ids) for s in req.sequences[:: body.n])
    completion_tokens = sum(len(s.output_ids) for s in req.sequences)
    return {
        "id": req.request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": state.served_model_name,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def _top_logprobs(state: Any, body: CompletionRequest, seq: Sequence) -> list[dict[str, float]]:
    """OpenAI's ``top_logprobs``: per token, ``{token: logprob}`` of its most likely alternatives
    (keys ``token_id:<id>`` with ``return_tokens_as_token_ids``, so no two alternatives collide)."""
    out = []
    for alternatives in seq.top_logprobs:
        ids = [token for token, _ in alternatives]
        names = (
            [f"token_id:{t}" for t in ids]
            if body.return_tokens_as_token_ids
            else state.tokenizer.convert_ids_to_tokens(ids)
        )
        out.append({name: value for name, (_, value) in zip(names, alternatives, strict=True)})
    return out


async def models(request: web.Request) -> web.Response:
    """``GET /v1/models``."""
    state = request.app[STATE]
    entry = {"id": state.served_model_name, "object": "model", "max_model_len": state.options.max_model_len}
    return web.json_response({"object": "list", "data": [entry]})


async def health(request: web.Request) -> web.Response:
    """``GET /health``: 200 while the generation loop is alive."""
    alive = request.app[STATE].engine.alive
    return web.Response(status=200 if alive else 503, text="ok" if alive else "generation loop stopped")


async def metrics(request: web.Request) -> web.Response:
    """``GET /metrics``: Prometheus text, names ``telescope:<stat>``."""
    state = request.app[STATE]
    label = f'{{model_name="{state.served_model_name}"}}'
    lines = [f"telescope:{name}{label} {float(value)}" for name, value in state.engine.stats().items()]
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")


async def abort(request: web.Request) -> web.Response:
    """``POST /abort_requests``."""
    try:
        body = await _parse(request, AbortRequest)
    except BadRequest as exc:
        return _error(400, str(exc))
    found = request.app[STATE].engine.abort(body.request_ids or None)
    return web.json_response({"aborted": found})


async def pause(request: web.Request) -> web.Response:
    """``POST /pause?mode=keep|wait|abort``."""
    try:
        mode = request.query.get("mode", "keep")
        await asyncio.get_running_loop().run_in_executor(None, request.app[STATE].engine.pause, mode)
    except ValueError as exc:
        return _error(400, str(exc))
    return web.json_response({"paused": True})


async def resume(request: web.Request) -> web.Response:
    """``POST /resume``."""
    request.app[STATE].engine.resume()
    return web.json_response({"paused": False})


async def is_paused(request: web.Request) -> web.Response:
    """``GET /is_paused``."""
    return web.json_response({"is_paused": request.app[STATE].engine.is_paused})


async def weights_init(request: web.Request) -> web.Response:
    """``POST /telescope/weights/init``: join the trainer's weight-sync group (blocks until all joined)."""
    sync: ServerWeightSync = request.app[STATE].weight_sync
    try:
        body = await _parse(request, WeightSyncInitRequest)
        await asyncio.get_running_loop().run_in_executor(None, sync.join, body)
    except (BadRequest, WeightSyncError) as exc:
        return _error(400, str(exc), type(exc).__name__)
    return web.json_response({"joined": True, "rank": body.rank})


async def weights_update(request: web.Request) -> web.Response:
    """``POST /telescope/weights/update``: receive, load between decode steps, verify."""
    sync: ServerWeightSync = request.app[STATE].weight_sync
    try:
        body = await _parse(request, WeightUpdateRequest)
        result = await asyncio.get_running_loop().run_in_executor(None, sync.update, body.version, body.apply)
    except BadRequest as exc:
        return _error(400, str(exc))
    except WeightSyncMismatchError as exc:
        return _error(409, str(exc), "WeightSyncMismatchError", tensors=exc.tensors, where=exc.where)
    except WeightSyncError as exc:
        return _error(409, str(exc), "WeightSyncError")
    return web.json_response(result.model_dump())


async def weights_version(request: web.Request) -> web.Response:
    """``GET /telescope/weights/version``."""
    return web.json_response({"weight_version": request.app[STATE].engine.weight_version})
