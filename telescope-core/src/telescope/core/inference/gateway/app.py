"""The gateway: OpenAI's ``/v1/models``, ``/v1/completions`` and ``/v1/chat/completions`` over an engine.

It renders chat prompts to token ids itself (the tokenizer's chat template), sends the engine token
ids through its ``ServerClient`` (the same client on the transformers engine and on vLLM), and
builds OpenAI answers from the ids and logprobs the engine sampled; tool calls are parsed out of
the sampled text. Streaming answers are sent as server-sent events once the choices are generated.

Access: like every listener of a run (``cluster.http_guard``), a request whose ``Host`` does not
name this gateway is refused (421: DNS rebinding), and so is a POST that is not JSON (415: what a
web page can send ``no-cors``). With a ``secret``, every ``/v1`` route needs
``Authorization: Bearer <secret>`` (the openai client sends its ``api_key`` so) or a rollout key of
``capture`` (the call is then recorded for that rollout). ``/health`` is open. Without a secret (a
gateway bound to loopback for tests and benches) anything but an unknown or ended rollout key is let in.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web
from pydantic import BaseModel, ConfigDict, ValidationError

from telescope.core.cluster.http_guard import content_type_refusal, host_refusal
from telescope.core.cluster.run_secret import authorized
from telescope.core.env.chat import ChatOptions
from telescope.core.inference.client import Completion, InferenceServerError
from telescope.core.inference.gateway.capture import (
    CapturedCall,
    CaptureRegistry,
    CaptureSession,
    reuse_sampled_ids,
)
from telescope.core.inference.gateway.chat import ToolCallParser, parse_message, render_chat
from telescope.core.inference.gateway.errors import BadRequest, GatewayError, error_body, infra_code
from telescope.core.inference.gateway.schema import ChatCompletionsBody, CompletionsBody, _Sampling
from telescope.core.inference.gateway.scoring import prompt_logprobs_param, wire_prompt_logprobs
from telescope.core.inference.gateway.stream import chat_chunks, completion_chunks
from telescope.core.inference.server_client import ServerClient

if TYPE_CHECKING:
    from telescope.core.config import TelescopeConfig

__all__ = ["Gateway", "GatewaySettings"]

ROUTES = {"models": "/v1/models", "completions": "/v1/completions", "chat": "/v1/chat/completions"}


class GatewaySettings(BaseModel):
    """How a gateway serves its model."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)

    served_model_name: str
    """The model id clients name (``GET /v1/models``)."""
    max_model_len: int
    """Context length of the engine: prompt plus completion tokens."""
    max_tokens: int = 1024
    """Completion tokens of a chat call that gives no ``max_tokens`` (capped by what the context leaves)."""
    tool_call_parser: ToolCallParser = "xml"
    """How tool calls are read from the text: ``xml`` (``<tool_call>{json}</tool_call>``, Hermes/Qwen)
    or ``python`` (``name(arg=...)`` calls of the request's tools)."""
    enable_thinking: bool = False
    """Default ``enable_thinking`` passed to the chat template."""
    chat_template: str | None = None
    """A Jinja chat template replacing the tokenizer's (a request's ``chat_template`` wins)."""

    @classmethod
    def from_config(cls, cfg: TelescopeConfig, **fields: Any) -> GatewaySettings:
        """Settings of a run config (``TelescopeConfig``): its model, context and chat settings; ``fields`` win."""
        values = {
            "served_model_name": cfg.model,
            "max_model_len": cfg.max_model_len,
            "enable_thinking": cfg.enable_thinking,
            "chat_template": cfg.chat_template,
            "tool_call_parser": cfg.agent_tool_call_parser,
        }
        return cls(**{**values, **fields})


@dataclass
class _Call:
    """What one engine call needs."""

    prompts: list[list[int]]
    params: dict[str, Any]
    session: CaptureSession | None


class Gateway:
    """OpenAI routes over one engine client; ``app()`` is the aiohttp application."""

    def __init__(
        self,
        client: ServerClient,
        tokenizer: Any,
        settings: GatewaySettings,
        *,
        secret: str | None = None,
        capture: CaptureRegistry | None = None,
    ) -> None:
        self.client = client
        self.tokenizer = tokenizer
        self.settings = settings
        self.secret = secret
        self.capture = capture if capture is not None else CaptureRegistry()
        self._bound_host = ""
        self._chat = ChatOptions(settings.enable_thinking, settings.chat_template)

    def app(self, bound_host: str = "") -> web.Application:
        """The routes, behind the error and access middlewares (``bound_host``: the host it listens
        on, a name it also answers to)."""
        self._bound_host = bound_host
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[self._errors, self._doors])
        app.router.add_get(ROUTES["models"], self.models)
        app.router.add_post(ROUTES["completions"], self.completions)
        app.router.add_post(ROUTES["chat"], self.chat_completions)
        app.router.add_get("/health", self.health)
        return app

    # --- access and errors -------------------------------------------------------------------
    @web.middleware
    async def _errors(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            return await handler(request)
        except GatewayError as exc:
            return web.json_response(exc.body(), status=exc.status)
        except web.HTTPException as exc:  # unknown route, wrong method: OpenAI's shape too
            kind = "not_found_error" if exc.status == 404 else "invalid_request_error"
            message = f"{request.method} {request.path}: {exc.reason}"
            return web.json_response(error_body(message, kind), status=exc.status)

    @web.middleware
    async def _doors(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Host and content type, before anything is read; who may call is ``_session``'s."""
        headers = request.headers
        refused = host_refusal(
            headers.get("Host"), bound_host=self._bound_host, what="this gateway"
        ) or content_type_refusal(request.method, request.path, headers.get("Content-Type"))
        if refused is not None:
            raise GatewayError(refused.message, status=refused.status)
        return await handler(request)

    def _session(self, request: web.Request) -> CaptureSession | None:
        """The caller's rollout session (None: a plain call), or raise when it may not call."""
        header = request.headers.get("Authorization", "")
        token = header.partition(" ")[2].strip() if header.lower().startswith("bearer ") else ""
        if token and self.capture.is_rollout_key(token):
            session = self.capture.lookup(token)  # raises for an ended rollout
            if session is None:
                raise GatewayError("unknown rollout key: it was never handed out by this gateway", status=401)
            return session
        if self.secret is not None and not authorized(header, self.secret):
            raise GatewayError(
                "this gateway needs the run secret: send `Authorization: Bearer <secret>` "
                "(openai.OpenAI(api_key=<secret>)); `telescope serve` prints it, or set TELESCOPE_RUN_SECRET",
                status=401,
            )
        return None

    async def _body(self, request: web.Request, model: type[_Sampling]) -> Any:
        try:
            raw = await request.json()
        except ValueError as exc:
            raise BadRequest(f"the body is not JSON: {exc}") from None
        try:
            body = model.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first["loc"])
            raise BadRequest(
                f"{param}: {first['msg']} (got {first.get('input')!r:.200})", param=param
            ) from None
        if body.model != self.settings.served_model_name:
            raise GatewayError(
                f"model {body.model!r} is not served here; this gateway serves "
                f"{self.settings.served_model_name!r} (GET /v1/models)",
                param="model",
                code="model_not_found",
                status=404,
            )
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(body, name):
                raise BadRequest(f"{name} is not supported (only 0): {getattr(body, name)}", param=name)
        return body

    # --- routes -------------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        """``GET /health``: the gateway is up (the engine's health is the engine's route)."""
        return web.Response(text="ok")

    async def models(self, request: web.Request) -> web.Response:
        """``GET /v1/models``."""
        self._session(request)
        entry = {
            "id": self.settings.served_model_name,
            "object": "model",
            "created": 0,
            "owned_by": "telescope",
            "max_model_len": self.settings.max_model_len,
        }
        return web.json_response({"object": "list", "data": [entry]})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/completions``."""
        session = self._session(request)
        body: CompletionsBody = await self._body(request, CompletionsBody)
        if body.echo or body.suffix is not None:
            raise BadRequest("echo and suffix are not supported; leave them out", param="echo")
        prompts = await asyncio.to_thread(self._completion_prompts, body)
        params = self._engine_params(body, body.max_tokens, body.logprobs)
        call = _Call(prompts, params | prompt_logprobs_param(body.prompt_logprobs), session)
        outputs = await self._generate(call)
        texts = [self._text(c, body) for out in outputs for c in out]
        response = self._completion_response(body, prompts, outputs, texts)
        if body.stream:
            ids = [c.token_ids for out in outputs for c in out]
            return await _send_events(request, completion_chunks(response, ids, self.tokenizer, body))
        return web.json_response(response)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/chat/completions``."""
        session = self._session(request)
        body: ChatCompletionsBody = await self._body(request, ChatCompletionsBody)
        tool_names = self._tool_names(body)
        if body.response_format is not None and body.response_format.get("type") != "text":
            raise BadRequest(
                f"response_format {body.response_format.get('type')!r} is not supported (no constrained "
                "decoding); leave it out or use {'type': 'text'}",
                param="response_format",
            )
        text = await asyncio.to_thread(render_chat, self.tokenizer, body, self._chat)
        calls = list(session.calls) if session is not None else []
        prompt = await asyncio.to_thread(reuse_sampled_ids, calls, text, self.tokenizer)
        room = self.settings.max_model_len - len(prompt)
        if room <= 0:
            raise BadRequest(
                f"the rendered messages are {len(prompt)} tokens; the model's context is "
                f"{self.settings.max_model_len}: shorten the conversation",
                param="messages",
                code="context_length_exceeded",
            )
        asked = [m for m in (body.max_tokens, body.max_completion_tokens) if m is not None]
        max_tokens = min(asked) if asked else min(self.settings.max_tokens, room)
        top = (body.top_logprobs or 0) if body.logprobs else None
        call = _Call([prompt], self._engine_params(body, max_tokens, top), session)
        (choices,) = await self._generate(call)
        response = self._chat_response(body, prompt, choices, tool_names)
        if body.stream:
            ids = [c.token_ids for c in choices]
            return await _send_events(request, chat_chunks(response, ids, self.tokenizer, body))
        return web.json_response(response)

    # --- engine calls ------------------------------------------------------------------------
    def _completion_prompts(self, body: CompletionsBody) -> list[list[int]]:
        raw = body.prompt
        items: list[Any] = [raw] if isinstance(raw, str) or (raw and isinstance(raw[0], int)) else list(raw)
        if not items:
            raise BadRequest("prompt is empty", param="prompt")
        prompts = []
        for i, item in enumerate(items):
            ids = (
                self.tokenizer(item, add_special_tokens=False)["input_ids"] if isinstance(item, str) else item
            )
            if not ids:
                raise BadRequest(f"prompt {i} is empty", param="prompt")
            prompts.append(list(ids))
        return prompts

    def _engine_params(self, body: _Sampling, max_tokens: int, top: int | None) -> dict[str, Any]:
        params: dict[str, Any] = {
            "n": body.n,
            "temperature": body.temperature,
            "top_p": body.top_p if body.top_p < 1 else None,
            "max_tokens": max_tokens,
            "seed": body.seed,
            "stop": body.stop_strings() or None,
            "stop_token_ids": body.stop_token_ids,
            "ignore_eos": body.ignore_eos,
            "skip_special_tokens": body.skip_special_tokens,
            "logprobs": top or 0,
        }
        if top:
            params["return_tokens_as_token_ids"] = True
        return params

    async def _generate(self, call: _Call) -> list[list[Completion]]:
        """Each prompt's choices, from the session's engine; a rollout's calls are recorded."""
        params = dict(call.params)
        client = self.client
        if call.session is not None:
            left = call.session.admit()
            if left is not None:
                params["max_tokens"] = min(params["max_tokens"], left)
            params.update(call.session.forced)
            client = call.session.client or self.client
        request_id = f"gw-{uuid.uuid4().hex}"
        try:
            outputs = await asyncio.gather(
                *[
                    client.complete(prompt, request_id=f"{request_id}-{i}", **params)
                    for i, prompt in enumerate(call.prompts)
                ]
            )
        except InferenceServerError as exc:
            if 400 <= exc.status < 500:
                raise BadRequest(str(exc).removeprefix(f"inference server error {exc.status}: ")) from None
            raise GatewayError(f"the engine failed: {exc}", status=502, code=infra_code(exc)) from None
        except (OSError, TimeoutError, aiohttp.ClientError) as exc:
            raise GatewayError(
                f"the engine could not be reached: {type(exc).__name__}: {exc}",
                status=502,
                code=infra_code(exc),
            ) from None
        if call.session is not None:
            call.session.record(
                [
                    CapturedCall(
                        prompt_ids=list(prompt),
                        completion_ids=list(c.token_ids),
                        logprobs=list(c.logprobs),
                        finish_reason=c.finish_reason,
                        weight_versions=c.weight_versions,
                        text=self.tokenizer.decode(c.token_ids, skip_special_tokens=True),
                    )
                    for prompt, out in zip(call.prompts, outputs, strict=True)
                    for c in out
                ]
            )
        return list(outputs)

    def _text(self, choice: Completion, body: _Sampling) -> tuple[str, str | None]:
        """(text, finish_reason): the choice decoded, cut before the first stop string."""
        text = self.tokenizer.decode(choice.token_ids, skip_special_tokens=body.skip_special_tokens)
        reason = choice.finish_reason
        cuts = [i for i in (text.find(s) for s in body.stop_strings()) if i >= 0]
        if cuts:
            text, reason = text[: min(cuts)], "stop"
        return text, reason

    # --- answers -------------------------------------------------------------------------------
    def _usage(self, prompts: list[list[int]], outputs: list[list[Completion]]) -> dict[str, int]:
        prompt_tokens = sum(len(p) for p in prompts)
        completion_tokens = sum(len(c.token_ids) for out in outputs for c in out)
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }

    def _token_strings(self, ids: list[int], body: _Sampling) -> list[str]:
        if body.return_tokens_as_token_ids:
            return [f"token_id:{i}" for i in ids]
        return [str(t) for t in self.tokenizer.batch_decode([[i] for i in ids])]

    def _completion_logprobs(self, choice: Completion, text: str, body: _Sampling) -> dict[str, Any]:
        tokens = self._token_strings(choice.token_ids, body)
        offsets, at = [], 0
        for token in tokens:
            offsets.append(min(at, len(text)))
            at += len(token)
        top = None
        if choice.top_logprobs is not None:
            top = [
                dict(zip(self._token_strings(list(alt), body), alt.values(), strict=True))
                for alt in choice.top_logprobs
            ]
        return {
            "tokens": tokens,
            "token_logprobs": choice.logprobs,
            "top_logprobs": top,
            "text_offset": offsets,
        }

    def _completion_response(
        self,
        body: CompletionsBody,
        prompts: list[list[int]],
        outputs: list[list[Completion]],
        texts: list[tuple[str, str | None]],
    ) -> dict[str, Any]:
        choices = []
        flat = [(p, c) for p, out in enumerate(outputs) for c in out]
        for index, ((p, choice), (text, reason)) in enumerate(zip(flat, texts, strict=True)):
            entry: dict[str, Any] = {"index": index, "text": text, "finish_reason": reason, "logprobs": None}
            if body.logprobs is not None:
                entry["logprobs"] = self._completion_logprobs(choice, text, body)
            if body.prompt_logprobs is not None:
                entry["prompt_logprobs"] = wire_prompt_logprobs(choice.prompt_logprobs)
            if body.return_token_ids:
                entry["token_ids"] = choice.token_ids
                entry["prompt_token_ids"] = prompts[p]
            choices.append(entry)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.settings.served_model_name,
            "choices": choices,
            "usage": self._usage(prompts, outputs),
        }

    def _tool_names(self, body: ChatCompletionsBody) -> list[str] | None:
        choice = body.tool_choice
        if choice is None or choice == "auto":
            return [t.function.name for t in body.tools] if body.tools else None
        if choice == "none":
            return None
        raise BadRequest(
            f"tool_choice {choice!r} is not supported: the gateway does not constrain decoding; use "
            "'auto' (the model decides) or 'none'",
            param="tool_choice",
        )

    def _chat_logprobs(self, choice: Completion, body: _Sampling) -> dict[str, Any]:
        tokens = self._token_strings(choice.token_ids, body)
        content = []
        for i, (token, logprob) in enumerate(zip(tokens, choice.logprobs, strict=True)):
            alternatives = []
            if choice.top_logprobs is not None:
                names = self._token_strings(list(choice.top_logprobs[i]), body)
                alternatives = [
                    {"token": name, "logprob": value, "bytes": list(name.encode())}
                    for name, value in zip(names, choice.top_logprobs[i].values(), strict=True)
                ]
            content.append(
                {
                    "token": token,
                    "logprob": logprob,
                    "bytes": list(token.encode()),
                    "top_logprobs": alternatives,
                }
            )
        return {"content": content}

    def _chat_response(
        self,
        body: ChatCompletionsBody,
        prompt: list[int],
        choices: list[Completion],
        tool_names: list[str] | None,
    ) -> dict[str, Any]:
        out = []
        for choice in choices:
            text, reason = self._text(choice, body)
            message = parse_message(
                text, tool_names, self.settings.tool_call_parser, body.parallel_tool_calls
            )
            entry: dict[str, Any] = {
                "index": choice.index,
                "message": {"role": "assistant", "content": message.content},
                "finish_reason": "tool_calls" if message.tool_calls else reason,
                "logprobs": self._chat_logprobs(choice, body) if body.logprobs else None,
            }
            if message.tool_calls:
                entry["message"]["tool_calls"] = message.tool_calls
            if body.return_token_ids:
                entry["token_ids"] = choice.token_ids
            out.append(entry)
        response: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.settings.served_model_name,
            "choices": out,
            "usage": self._usage([prompt], [choices]),
        }
        if body.return_token_ids:
            response["prompt_token_ids"] = prompt
        return response


async def _send_events(request: web.Request, events: list[dict[str, Any]]) -> web.StreamResponse:
    """Server-sent events: one ``data:`` line per chunk, then ``data: [DONE]``."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for event in events:
        await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
