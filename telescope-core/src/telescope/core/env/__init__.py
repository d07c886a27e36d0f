"""The environment API: samples, rewards, rollout state and environment base classes.

How a host (orchestrator, eval runner) drives an environment::

    env = create_environment(registry, "countdown", {"seed": 1})   # kwargs validated; env.name == "countdown"
    samples = env.load_dataset()                                   # or env.load_dataset(num_samples=100)
    chat = ChatOptions.from_config(cfg)                            # enable_thinking, chat_template

    # single-turn
    prompt = env.format_prompt(sample, tokenizer, chat)            # through the chat template
    result = await env.score(completion_text, sample, eos_token)   # never raises; RewardResult

    # multi-turn (env.is_multi_turn)
    state = env.create_initial_state(sample)
    messages = env.get_initial_prompt(sample)
    ... prompt = env.format_messages(messages, tokenizer, chat); generate; append a TrajectoryStep
    env_msgs = await env.env_response(messages + [assistant], state)
    done, reason = env.is_done(state)                              # checked after env_response
    messages = env.get_next_prompt_messages(state, env_msgs)
    result = await env.score(state, sample, eos_token)

``run_text_rollout`` is that loop on plain text. ``env.evaluate`` returns eval metrics with the
same guarantees; ``aggregate_pass_k`` turns per-prompt metric lists into pass@k / pass^k.
Importing this package never imports torch, transformers or math-verify (they load only
when a prompt is rendered or an answer verified).
"""

from __future__ import annotations

from telescope.core.env.agent import AgentEnvironment, AgentKwargs
from telescope.core.env.base import (
    ConversationEnvironment,
    Environment,
    EnvironmentKwargs,
    MultiTurnEnvironment,
    MultiTurnKwargs,
    SingleTurnEnvironment,
    SingleTurnKwargs,
)
from telescope.core.env.chat import ChatOptions, render_messages
from telescope.core.env.data import DatasetKwargs, load_rows, read_local_rows, select_rows
from telescope.core.env.math_check import MathVerifier, MathVerifyTimeout, verify_math_answer
from telescope.core.env.parsers import (
    extract_answer_tags,
    extract_boxed_answer,
    extract_code_block,
    extract_xml_tag,
    strip_eos,
    strip_think_tags,
    verify_exact_match,
)
from telescope.core.env.passk import aggregate_pass_k, pass_at_k, pass_pow_k
from telescope.core.env.resolve import create_environment, create_eval
from telescope.core.env.rollout import run_text_rollout
from telescope.core.env.rubric import Rubric
from telescope.core.env.tool_calls import (
    ParsedToolCalls,
    ToolCall,
    parse_function_calls,
    parse_xml_tool_calls,
)
from telescope.core.env.tool_env import ToolEnvironment, ToolEnvironmentKwargs, ToolResult
from telescope.core.env.tool_schema import func_to_tool_schema
from telescope.core.env.types import (
    ChatMessage,
    EvalMetricsResult,
    Messages,
    RewardResult,
    RolloutState,
    Sample,
    TrajectoryStep,
    info_turn,
)

__all__ = [
    "AgentEnvironment",
    "AgentKwargs",
    "ConversationEnvironment",
    "ChatMessage",
    "ChatOptions",
    "DatasetKwargs",
    "Environment",
    "EnvironmentKwargs",
    "EvalMetricsResult",
    "MathVerifier",
    "MathVerifyTimeout",
    "Messages",
    "MultiTurnEnvironment",
    "MultiTurnKwargs",
    "ParsedToolCalls",
    "RewardResult",
    "RolloutState",
    "Rubric",
    "Sample",
    "SingleTurnEnvironment",
    "SingleTurnKwargs",
    "ToolCall",
    "ToolEnvironment",
    "ToolEnvironmentKwargs",
    "ToolResult",
    "TrajectoryStep",
    "aggregate_pass_k",
    "create_environment",
    "create_eval",
    "extract_answer_tags",
    "extract_boxed_answer",
    "extract_code_block",
    "extract_xml_tag",
    "func_to_tool_schema",
    "info_turn",
    "load_rows",
    "parse_function_calls",
    "parse_xml_tool_calls",
    "pass_at_k",
    "pass_pow_k",
    "read_local_rows",
    "render_messages",
    "run_text_rollout",
    "select_rows",
    "strip_eos",
    "strip_think_tags",
    "verify_exact_match",
    "verify_math_answer",
]
