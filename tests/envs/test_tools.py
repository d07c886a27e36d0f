"""Tool schemas, tool-call parsing (fuzzed), ToolEnvironment errors and the calculator env."""

from __future__ import annotations

import asyncio
import json
import random
import string
from typing import Literal

from telescope.core.env import (
    ChatOptions,
    Sample,
    ToolEnvironment,
    ToolEnvironmentKwargs,
    func_to_tool_schema,
    parse_function_calls,
    parse_xml_tool_calls,
    run_text_rollout,
)


def search(query: str, limit: int = 3, tags: list[str] | None = None, mode: Literal["a", "b"] = "a") -> str:
    """Search the web.

    Args:
        query: What to look for,
            possibly several words.
        limit: Maximum results.
        tags: Optional filters.
    """
    return query


def test_schema_from_hints_and_docstring() -> None:
    schema = func_to_tool_schema(search)
    fn = schema["function"]
    assert schema["type"] == "function" and fn["name"] == "search" and fn["description"] == "Search the web."
    props = fn["parameters"]["properties"]
    assert props["query"] == {"type": "string", "description": "What to look for, possibly several words."}
    assert props["limit"] == {"type": "integer", "description": "Maximum results."}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}, "description": "Optional filters."}
    assert props["mode"] == {"type": "string", "enum": ["a", "b"]}
    assert fn["parameters"]["required"] == ["query"]

    def sphinx(x: float, flag: bool) -> None:
        """Do it.

        :param x: the value
        :param flag: a switch
        """

    props = func_to_tool_schema(sphinx)["function"]["parameters"]["properties"]
    assert props == {
        "x": {"type": "number", "description": "the value"},
        "flag": {"type": "boolean", "description": "a switch"},
    }


def test_xml_and_function_call_parsing() -> None:
    text = (
        'a <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call> '
        '<TOOL_CALL> {"name": "mul", "arguments": "{\\"a\\": 3}"} </TOOL_CALL>'
        "<tool_call>{not json}</tool_call><tool_call>[1]</tool_call>"
    )
    parsed = parse_xml_tool_calls(text)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("add", {"a": 1, "b": 2}), ("mul", {"a": 3})]
    assert len(parsed.errors) == 2 and "malformed tool call JSON" in parsed.errors[0]
    assert parse_xml_tool_calls("<tool_call>{...").errors == [
        "unterminated <tool_call>: close it with </tool_call>"
    ]
    assert not parse_xml_tool_calls("plain answer").attempted

    fn = parse_function_calls('x = add(1, b=2) and print(3) then mul(a=")", b=[1, (2, 3)])', {"add", "mul"})
    assert [(c.name, c.arguments) for c in fn.calls] == [
        ("add", {"0": 1, "b": 2}),
        ("mul", {"a": ")", "b": [1, (2, 3)]}),
    ]
    bad = parse_function_calls("add(__import__('os'))", {"add"})
    assert not bad.calls and "literals" in bad.errors[0]


def _fuzz_cases(rng: random.Random, count: int) -> list[str]:
    valid = (
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": [2, {"c": "d"}]}}</tool_call> add(1, b="x)")'
    )
    pieces = [
        "<tool_call>",
        "</tool_call>",
        "{",
        "}",
        "[",
        "]",
        '"',
        "'",
        "\\",
        "(",
        ")",
        "add(",
        "name",
        ":",
        '"arguments"',
        "\x00",
        "\ud800",
        "é",
        "1e999",
        "NaN",
        "null",
        ",",
        "'''",
        '"""',
        "*" * 3,
    ]
    cases = []
    for i in range(count):
        kind = i % 4
        if kind == 0:  # mutate a valid call
            chars = list(valid)
            for _ in range(rng.randint(1, 8)):
                pos = rng.randrange(len(chars))
                chars[pos] = rng.choice(string.printable)
            cases.append("".join(chars))
        elif kind == 1:  # random structural tokens
            cases.append("".join(rng.choice(pieces) for _ in range(rng.randint(1, 60))))
        elif kind == 2:  # truncations
            cases.append(valid[: rng.randrange(len(valid))])
        else:  # deep nesting and huge payloads
            depth = rng.randint(100, 5000)
            inner = rng.choice(["[" * depth + "]" * depth, "(" * depth, '{"a":' * depth])
            cases.append(f'<tool_call>{{"name": "add", "arguments": {inner}}}</tool_call> add({inner})')
    return cases


def test_tool_call_parsers_never_raise_on_fuzzed_input() -> None:
    cases = _fuzz_cases(random.Random(1234), 1200)
    assert len(cases) >= 1000
    for text in cases:
        for parsed in (parse_xml_tool_calls(text), parse_function_calls(text, {"add"})):
            assert all(isinstance(c.arguments, dict) for c in parsed.calls)
            assert all(isinstance(e, str) for e in parsed.errors)


async def slow_tool(x: int) -> int:
    """Sleeps."""
    await asyncio.sleep(5)
    return x


def fail_tool() -> str:
    """Fails."""
    raise RuntimeError("db down")


def echo(text: str) -> str:
    """Echo text."""
    return text


class _ToolEnv(ToolEnvironment):
    tools = [slow_tool, fail_tool, echo]

    def load_dataset(self, num_samples: int = -1) -> list[Sample]:
        return [Sample("go")]

    async def compute_reward(self, state, eos_token=""):
        raise NotImplementedError


def test_tool_errors_come_back_as_observations() -> None:
    env = _ToolEnv(ToolEnvironmentKwargs(tool_timeout_s=0.2, max_turns=10))
    turns = iter(
        [
            '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
            '<tool_call>{"name": "echo", "arguments": {"wrong": 1}}</tool_call>',
            '<tool_call>{"name": "fail_tool", "arguments": {}}</tool_call>',
            '<tool_call>{"name": "slow_tool", "arguments": {"x": 1}}</tool_call>',
            "<tool_call>{broken</tool_call>",
            '<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>'
            '<tool_call>{"name": "echo", "arguments": {"text": "yo"}}</tool_call>',
            "final answer",
        ]
    )
    state = asyncio.run(run_text_rollout(env, env.get_sample(0), lambda messages: next(turns)))
    assert state.stop_reason == "final_answer" and state.num_turns == 7
    observations = [m["content"] for m in state.last_messages() if m.get("turn_type") == "tool_result"]
    assert "unknown tool 'nope'. Available tools: echo, fail_tool, slow_tool" in observations[0]
    assert observations[1].startswith("[echo] Error: bad arguments")
    assert observations[2] == "[fail_tool] Error: RuntimeError: db down"
    assert observations[3] == "[slow_tool] Error: timed out after 0.2s"
    assert observations[4].startswith("[parse] Error: malformed tool call JSON")
    assert observations[5] == "Tool 1: [echo] hi\nTool 2: [echo] yo"
    metrics = env.get_tool_metrics(state)
    assert metrics == {
        "total_tool_calls": 7.0,
        "tool_success_count": 2.0,
        "tool_error_count": 5.0,
        "tool_success_rate": 2 / 7,
        "unique_tools_used": 3.0,
        "slow_tool_calls": 1.0,
        "fail_tool_calls": 1.0,
        "echo_calls": 3.0,
        "tool_argument_error_count": 1.0,
    }
    assert "# Available Tools" in env.system_prompt and "## echo" in env.system_prompt


def test_calculator_end_to_end_scripted(registry, tiny_tokenizer) -> None:
    env = registry.create("environment", "calculator", {"num_samples": 3, "seed": 5})
    sample = env.load_dataset()[0]
    expr = sample.metadata["expression"]
    prompt = env.format_messages(
        env.get_initial_prompt(sample), tiny_tokenizer, ChatOptions(enable_thinking=True)
    )
    assert "## add" in prompt and sample.prompt in prompt and prompt.endswith("<|im_start|>assistant\n")

    def model(messages: list[dict]) -> str:
        """Solves the expression with one tool call per operation, then answers."""
        results = [m["content"] for m in messages if m.get("turn_type") == "tool_result"]
        steps = _steps(expr)
        if len(results) < len(steps):
            a = steps[0][1] if not results else float(results[-1].split("] ")[1])
            op, _, b = steps[len(results)]
            return f"<tool_call>{json.dumps({'name': op, 'arguments': {'a': a, 'b': b}})}</tool_call>"
        return f"<answer>{float(results[-1].split('] ')[1]):g}</answer>"

    state = asyncio.run(run_text_rollout(env, sample, model))
    result = asyncio.run(env.score(state, sample))
    assert state.stop_reason == "final_answer"
    assert result.total_reward == 1.0
    assert result.sample_metrics["total_tool_calls"] == len(_steps(expr))
    wrong = asyncio.run(run_text_rollout(env, sample, lambda m: "<answer>-99999</answer>"))
    assert asyncio.run(env.score(wrong, sample)).total_reward == 0.0


def _steps(expr: str) -> list[tuple[str, float, float]]:
    """Left-to-right operations of '(a op b) op c' as (tool, left operand, right operand)."""
    tokens = expr.replace("(", "").replace(")", "").split()
    names = {"+": "add", "-": "subtract", "*": "multiply"}
    return [(names[tokens[i]], float(tokens[0]), float(tokens[i + 1])) for i in range(1, len(tokens), 2)]


def test_too_many_calls_in_one_message_are_capped() -> None:
    env = _ToolEnv(ToolEnvironmentKwargs(max_tool_calls_per_turn=2))
    call = '<tool_call>{"name": "echo", "arguments": {"text": "x"}}</tool_call>'
    turns = iter([call * 5, "done"])
    state = asyncio.run(run_text_rollout(env, env.get_sample(0), lambda messages: next(turns)))
    observation = next(m["content"] for m in state.last_messages() if m.get("turn_type") == "tool_result")
    assert observation.splitlines() == [
        "Tool 1: [parse] Error: 3 tool calls skipped: at most 2 per message",
        "Tool 2: [echo] x",
        "Tool 3: [echo] x",
    ]
    assert env.get_tool_metrics(state)["echo_calls"] == 2.0


def test_function_call_format_end_to_end(registry) -> None:
    env = registry.create("environment", "calculator", {"tool_call_format": "function", "num_samples": 1})
    assert "tool_name(param=value)" in env.system_prompt
    sample = Sample("What is 6 * 7?", "42")
    turns = iter(["Let me compute multiply(6, b=7)", "multiply(6, 7, 8)", "<answer>42</answer>"])
    state = asyncio.run(run_text_rollout(env, sample, lambda messages: next(turns)))
    observations = [m["content"] for m in state.last_messages() if m.get("turn_type") == "tool_result"]
    assert observations[0] == "[multiply] 42"
    assert observations[1].startswith("[multiply] Error: bad arguments")
    result = asyncio.run(env.score(state, sample))
    assert result.total_reward == 1.0 and result.sample_metrics["tool_error_count"] == 1.0


def test_arguments_are_checked_against_the_tool_schema(registry) -> None:
    env = registry.create("environment", "calculator", {"num_samples": 1})
    turns = iter(
        [
            '<tool_call>{"name": "add", "arguments": {"a": "2", "b": "3"}}</tool_call>',  # strings: no "23"
            '<tool_call>{"name": "add", "arguments": {"a": true, "b": 3}}</tool_call>',  # bool is not a number
            '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3.5}}</tool_call>',  # int fits number
            "final answer",
        ]
    )
    state = asyncio.run(run_text_rollout(env, env.get_sample(0), lambda messages: next(turns)))
    observations = [m["content"] for m in state.last_messages() if m.get("turn_type") == "tool_result"]
    assert observations[0] == (
        "[add] Error: bad arguments: 'a' must be a number, got str '2'; 'b' must be a number, got str '3'"
    )
    assert observations[1] == "[add] Error: bad arguments: 'a' must be a number, got bool True"
    assert observations[2] == "[add] 5.5"
    metrics = env.get_tool_metrics(state)
    assert (
        metrics["tool_argument_error_count"],
        metrics["tool_error_count"],
        metrics["tool_success_count"],
    ) == (
        2.0,
        2.0,
        1.0,
    )
