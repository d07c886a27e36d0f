"""ToolEnvironment: a multi-turn environment whose model calls Python functions as tools."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import Field

from telescope.core.env.base import EnvironmentKwargs, MultiTurnEnvironment, MultiTurnKwargs
from telescope.core.env.threads import run_in_daemon_thread
from telescope.core.env.tool_calls import (
    ParsedToolCalls,
    ToolCall,
    parse_function_calls,
    parse_xml_tool_calls,
)
from telescope.core.env.tool_schema import argument_errors, func_to_tool_schema
from telescope.core.env.types import ChatMessage, RolloutState

__all__ = ["ToolEnvironment", "ToolEnvironmentKwargs", "ToolResult"]


class ToolEnvironmentKwargs(MultiTurnKwargs):
    """Kwargs of tool-calling environments."""

    tool_call_format: Literal["xml", "function"] = "xml"
    """How the model calls tools: '<tool_call>{json}</tool_call>' (xml) or 'name(a=1)' (function)."""
    include_tool_schemas_in_prompt: bool = True
    """Describe the tools and the call format in the system prompt."""
    tool_timeout_s: float = Field(default=10.0, gt=0)
    """Seconds one tool call may take; past it the model gets a timeout error observation."""
    max_tool_result_chars: int = Field(default=4000, ge=1)
    """Tool results longer than this are truncated before they go back to the model."""
    max_tool_calls_per_turn: int = Field(default=16, ge=1)
    """Calls beyond this many in one message are not run; the model gets an error for them."""


@dataclass
class ToolResult:
    """The outcome of one tool call, as shown to the model and recorded in the state."""

    tool_name: str
    result: str
    success: bool = True
    error: str | None = None


class ToolEnvironment(MultiTurnEnvironment):
    """Subclasses list their tools (plain sync or async functions) in ``tools``."""

    kwargs_model: ClassVar[type[EnvironmentKwargs]] = ToolEnvironmentKwargs
    tools: ClassVar[list[Callable[..., Any]]] = []

    def __init__(
        self,
        kwargs: EnvironmentKwargs | None = None,
        *,
        name: str | None = None,
        tools: list[Callable[..., Any]] | None = None,
    ) -> None:
        super().__init__(kwargs, name=name)
        tool_list = list(self.tools if tools is None else tools)
        self.tool_map: dict[str, Callable[..., Any]] = {t.__name__: t for t in tool_list}
        self.tool_schemas = [func_to_tool_schema(t) for t in tool_list]
        self._schema_by_name = {s["function"]["name"]: s for s in self.tool_schemas}

    @property
    def tool_kwargs(self) -> ToolEnvironmentKwargs:
        """The kwargs, typed."""
        assert isinstance(self.kwargs, ToolEnvironmentKwargs)
        return self.kwargs

    @property
    def system_prompt(self) -> str | None:
        """The base system prompt plus, when enabled, the tools section."""
        base = super().system_prompt
        if not self.tool_kwargs.include_tool_schemas_in_prompt or not self.tool_schemas:
            return base
        section = self.tools_prompt_section()
        return f"{base}\n\n{section}" if base else section

    def tools_prompt_section(self) -> str:
        """Markdown describing each tool, its parameters and the call format."""
        lines = ["# Available Tools", ""]
        for schema in self.tool_schemas:
            fn = schema["function"]
            lines += [f"## {fn['name']}", fn["description"] or "(no description)", "", "**Parameters:**"]
            required = set(fn["parameters"]["required"])
            for pname, prop in fn["parameters"]["properties"].items():
                req = "required" if pname in required else "optional"
                desc = f": {prop['description']}" if prop.get("description") else ""
                lines.append(f"- `{pname}` ({prop['type']}) ({req}){desc}")
            lines.append("")
        lines += ["# Tool Call Format", ""]
        if self.tool_kwargs.tool_call_format == "xml":
            lines.append('<tool_call>{"name": "tool_name", "arguments": {"param": "value"}}</tool_call>')
        else:
            lines.append("tool_name(param=value)")
        lines += ["", "When you have the final answer, respond normally without tool calls."]
        return "\n".join(lines)

    def create_initial_state(self, sample: Any) -> RolloutState:
        """A state with empty tool-call records."""
        state = super().create_initial_state(sample)
        state.custom.update(tool_calls=[], tool_results=[], tool_success_count=0, tool_error_count=0)
        state.custom["tools_by_name"] = {name: 0 for name in self.tool_map}
        return state

    def parse_tool_calls(self, completion: str) -> ParsedToolCalls:
        """Tool calls in ``completion`` in the configured format (never raises)."""
        if self.tool_kwargs.tool_call_format == "xml":
            return parse_xml_tool_calls(completion)
        return parse_function_calls(completion, set(self.tool_map))

    def is_final_answer(self, completion: str, parsed: ParsedToolCalls, state: RolloutState) -> bool:
        """By default: the model attempted no tool call at all."""
        return not parsed.attempted

    async def execute_tool(self, call: ToolCall) -> ToolResult:
        """Run one call; every failure becomes an error result, never an exception."""
        func = self.tool_map.get(call.name)
        if func is None:
            available = ", ".join(sorted(self.tool_map)) or "(none)"
            return ToolResult(
                call.name, f"unknown tool '{call.name}'. Available tools: {available}", False, "unknown_tool"
            )
        wrong = argument_errors(func, self._schema_by_name[call.name], call.arguments)
        if wrong:  # checked against the schema the model was shown (no silent coercion, e.g. "2" + "3")
            return ToolResult(call.name, f"bad arguments: {'; '.join(wrong)}", False, "argument_error")
        try:
            value = await asyncio.wait_for(
                self._invoke(func, call.arguments), self.tool_kwargs.tool_timeout_s
            )
        except TimeoutError:
            return ToolResult(
                call.name, f"timed out after {self.tool_kwargs.tool_timeout_s}s", False, "timeout"
            )
        except TypeError as exc:
            return ToolResult(call.name, f"bad arguments: {exc}", False, "argument_error")
        except Exception as exc:  # noqa: BLE001 - tool errors go back to the model
            return ToolResult(call.name, f"{type(exc).__name__}: {exc}", False, type(exc).__name__)
        return ToolResult(call.name, self._clip(str(value)))

    async def _invoke(self, func: Callable[..., Any], arguments: dict[str, Any]) -> Any:
        positional = [arguments[k] for k in sorted((k for k in arguments if k.isdigit()), key=int)]
        keywords = {k: v for k, v in arguments.items() if not k.isdigit()}
        inspect.signature(func).bind(*positional, **keywords)  # TypeError before running
        if inspect.iscoroutinefunction(func):
            return await func(*positional, **keywords)
        return await run_in_daemon_thread(func, *positional, **keywords)

    def _clip(self, text: str) -> str:
        limit = self.tool_kwargs.max_tool_result_chars
        return text if len(text) <= limit else text[:limit] + f"... [truncated {len(text) - limit} chars]"

    def format_tool_result(self, result: ToolResult) -> str:
        """``[name] result`` or ``[name] Error: message``."""
        return (
            f"[{result.tool_name}] {result.result}"
            if result.success
            else f"[{result.tool_name}] Error: {result.result}"
        )

    async def env_response(self, messages: list[ChatMessage], state: RolloutState) -> list[ChatMessage]:
        """Run the calls in the last assistant message and reply with their results."""
        completion = str(messages[-1].get("content", "")) if messages else ""
        parsed = self.parse_tool_calls(completion)
        if self.is_final_answer(completion, parsed, state):
            state.custom["_no_more_turns"] = True
            return []
        limit = self.tool_kwargs.max_tool_calls_per_turn
        errors = list(parsed.errors)
        if len(parsed.calls) > limit:
            errors.append(f"{len(parsed.calls) - limit} tool calls skipped: at most {limit} per message")
        results = [ToolResult("parse", err, False, "parse_error") for err in errors]
        for call in parsed.calls[:limit]:
            result = await self.execute_tool(call)
            self._record(state, call, result)
            results.append(result)
        for result in results[: len(errors)]:
            self._record(state, None, result)
        lines = [self.format_tool_result(r) for r in results]
        content = (
            lines[0] if len(lines) == 1 else "\n".join(f"Tool {i + 1}: {t}" for i, t in enumerate(lines))
        )
        return [{"role": "user", "content": content, "turn_type": "tool_result"}]

    def _record(self, state: RolloutState, call: ToolCall | None, result: ToolResult) -> None:
        custom = state.custom
        if call is not None:
            custom["tool_calls"].append(
                {"name": call.name, "arguments": call.arguments, "raw": call.raw_text}
            )
            if call.name in custom["tools_by_name"]:
                custom["tools_by_name"][call.name] += 1
        custom["tool_results"].append(
            {
                "name": result.tool_name,
                "result": result.result,
                "success": result.success,
                "error": result.error,
            }
        )
        custom["tool_success_count" if result.success else "tool_error_count"] += 1
        if result.error == "argument_error":
            custom["tool_argument_error_count"] = custom.get("tool_argument_error_count", 0) + 1
        custom.setdefault("_pending_tool_calls", []).append(
            {
                "tool_name": result.tool_name,
                "arguments": json.dumps(call.arguments, default=str) if call else "{}",
                "raw_text": call.raw_text if call else "",
                "result": result.result,
                "success": result.success,
                "error": result.error,
            }
        )

    def is_done(self, state: RolloutState) -> tuple[bool, str | None]:
        """``final_answer`` when the model stopped calling tools, else the turn limit."""
        if state.custom.get("_no_more_turns"):
            return True, "final_answer"
        return super().is_done(state)

    def get_tool_metrics(self, state: RolloutState) -> dict[str, float]:
        """Tool usage numbers to merge into a reward's sample metrics."""
        custom = state.custom
        ok, bad = custom.get("tool_success_count", 0), custom.get("tool_error_count", 0)
        total = ok + bad
        by_name: dict[str, int] = custom.get("tools_by_name", {})
        metrics: dict[str, float] = {
            "total_tool_calls": float(total),
            "tool_success_count": float(ok),
            "tool_error_count": float(bad),
            "tool_success_rate": ok / total if total else 0.0,
            "tool_argument_error_count": float(custom.get("tool_argument_error_count", 0)),
            "unique_tools_used": float(sum(1 for n in by_name.values() if n > 0)),
        }
        metrics.update({f"{name}_calls": float(n) for name, n in by_name.items()})
        return metrics
