"""verifiers: a taskset of PrimeIntellect's verifiers library (its ``verifiers.v1`` stack) trained as an
agent environment. Install with ``pip install 'telescope-envs[verifiers]'`` (tested: verifiers 0.4.0).

The taskset is loaded by verifiers' own loader from its id (an installed module exporting a
``vf.Taskset``), with ``taskset_args`` validated by its own config class. Each task becomes a sample;
a rollout sends the task's system prompt and prompt to the model through the run's gateway (so every
turn is captured in token ids) with the tools of the task's ``vf.Toolset``s, run in process, while the
model calls them; it records the conversation as a verifiers ``Trace`` and scores it with
the task's own ``@vf.reward`` / ``@vf.metric`` functions and the rewards and metrics its config plugs
in (``Task.score``). The reward is ``trace.reward``, the weighted sum of those rewards.

What verifiers does beyond that needs its harness programs and runtime boxes (uv, containers, MCP
servers, tunnels), which a training rollout here does not start; ``config validate`` refuses a
taskset that uses any of it, naming the feature (see ``unsupported_features``).
"""

from __future__ import annotations

import inspect
import json
from typing import Any, ClassVar

from telescope.core.env import AgentEnvironment, RewardResult, Sample
from telescope.core.env.base import refuse_kwargs_problems
from telescope.envs.kwargs import VerifiersKwargs

__all__ = ["VerifiersEnvironment", "kwargs_problems", "unsupported_features"]

INSTALL = "pip install 'telescope-envs[verifiers]'"
TESTED_VERSION = "0.4.0"


def load_taskset(kw: VerifiersKwargs) -> Any:
    """The taskset ``kw`` names, built by verifiers from its id and ``taskset_args``."""
    from verifiers.v1.utils.loaders import load_taskset as vf_load_taskset
    from verifiers.v1.utils.loaders import taskset_config_type

    if not kw.taskset:
        raise ValueError(
            "name a verifiers taskset: taskset: MODULE (an installed module exporting a vf.Taskset)"
        )
    config = taskset_config_type(kw.taskset).model_validate({**kw.taskset_args, "id": kw.taskset})
    return vf_load_taskset(config)


def _needs_runtime(fn: Any) -> bool:
    param = inspect.signature(fn).parameters.get("runtime")
    return param is not None and param.default is inspect.Parameter.empty


def _toolset_problem(server: Any) -> str | None:
    """Why a tool server cannot run in process here (None: it can: a stateless vf.Toolset)."""
    from verifiers.v1.mcp import Toolset
    from verifiers.v1.state import State

    kind = type(server).__name__
    if not isinstance(server, Toolset):
        return f"tool server {kind} is not a vf.Toolset (only Toolsets run in process)"
    if getattr(server.config, "url", None):
        return f"toolset {kind} is remote (url {server.config.url}); remote MCP servers are not supported"
    if getattr(server, "_state_cls", State) is not State:
        return f"toolset {kind} keeps state ({server._state_cls.__name__}), which is not supported"
    return None


def unsupported_features(taskset: Any, probe: Any | None) -> list[str]:
    """What the taskset (and ``probe``, one of its tasks) uses that this adapter cannot run, one line each."""
    from verifiers.v1.task import Task
    from verifiers.v1.utils.decorators import discover_decorated

    name = type(taskset).__name__
    task_cls = type(taskset).task_type()
    problems = []
    if task_cls.NEEDS_CONTAINER:
        problems.append(
            f"{name}: its tasks need a container (Task.NEEDS_CONTAINER); runtime boxes are not supported"
        )
    for server in [*taskset.toolsets(taskset.config), *task_cls.toolsets(taskset.config.task)]:
        problem = _toolset_problem(server)
        if problem is not None:
            problems.append(f"{name}: {problem}")
    judges = [getattr(j, "id", type(j).__name__) for j in taskset.config.task.judges]
    if judges:
        problems.append(f"{name}: judges ({', '.join(map(str, judges))}) are not supported")
    for hook in ("setup", "finalize", "stage_verifier"):
        if getattr(task_cls, hook) is not getattr(Task, hook):
            problems.append(
                f"{name}: {task_cls.__name__}.{hook} runs in a runtime box, which is not supported"
            )
    if probe is not None:
        stops = [fn.__name__ for fn in probe.hooks("stop")]
        if stops:
            problems.append(f"{name}: stop conditions ({', '.join(stops)}) are not supported")
        intercepts = [fn.__name__ for fn in discover_decorated(probe, "intercept")]
        if intercepts:
            problems.append(f"{name}: @vf.intercept hooks ({', '.join(intercepts)}) are not supported")
        boxed = [fn.__name__ for fn in (*probe.hooks("reward"), *probe.hooks("metric")) if _needs_runtime(fn)]
        if boxed:
            problems.append(
                f"{name}: rewards/metrics that need a runtime ({', '.join(boxed)}) are not supported"
            )
    return problems


def kwargs_problems(kw: VerifiersKwargs) -> list[str]:
    """Why the taskset cannot be trained here: it does not load, or uses an unsupported feature."""
    try:
        taskset = load_taskset(kw)
        probe = next(iter(taskset.take(1)), None)
    except Exception as exc:  # noqa: BLE001 - verifiers' own message names the id and the fix
        return [f"taskset: '{kw.taskset}' does not load: {type(exc).__name__}: {exc}"]
    problems = unsupported_features(taskset, probe)
    if not taskset.bounded and kw.num_samples < 0:
        problems.append(f"taskset: '{kw.taskset}' is infinite; set num_samples")
    return [f"taskset: {p}" if not p.startswith("taskset:") else p for p in problems]


def _vf_message(message: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI chat message in verifiers' shape (its tool calls carry name and arguments flat)."""
    if not message.get("tool_calls"):
        return message
    calls = [{"id": c["id"], **c["function"]} for c in message["tool_calls"]]
    return {**message, "tool_calls": calls}


def _message_dict(message: Any) -> dict[str, Any]:
    return message if isinstance(message, dict) else dict(message.model_dump(exclude_none=True))


class VerifiersEnvironment(AgentEnvironment):
    """A verifiers taskset: its tasks as prompts, the model through the gateway, its own scoring."""

    kwargs_model: ClassVar[type[VerifiersKwargs]] = VerifiersKwargs  # type: ignore[assignment]
    default_name = "verifiers"
    kwargs_problems = staticmethod(kwargs_problems)
    """What ``config validate`` refuses in these kwargs (``registry_problems`` calls it)."""

    def __init__(self, kwargs: VerifiersKwargs | None = None, **extra: Any) -> None:
        super().__init__(kwargs, **extra)
        kw: VerifiersKwargs = self.kwargs  # type: ignore[assignment]
        refuse_kwargs_problems("verifiers", kwargs_problems(kw))
        self.taskset = load_taskset(kw)
        self._tasks: list[Any] = []
        self._shared: list[Any] | None = None

    def load_dataset(self, num_samples: int = -1) -> list[Sample]:
        """The taskset's tasks in its own order (``num_samples`` / kwargs.num_samples: the first ones)."""
        kw: VerifiersKwargs = self.kwargs  # type: ignore[assignment]
        limits = [n for n in (num_samples, kw.num_samples) if n >= 0]
        view = self.taskset.take(min(limits)) if limits else self.taskset
        self._tasks = list(view)
        self._samples = [
            Sample(task.data.prompt_text, str(getattr(task.data, "answer", "") or ""), {"index": i})
            for i, task in enumerate(self._tasks)
        ]
        return self._samples

    def initial_messages(self, task: Any) -> list[dict[str, Any]]:
        """The task's system prompt and prompt as OpenAI chat messages."""
        data = task.data
        messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
        if isinstance(data.prompt, str):
            messages.append({"role": "user", "content": data.prompt})
        else:
            messages.extend(_message_dict(m) for m in data.prompt or [])
        return messages

    def build_trace(self, task: Any, messages: list[dict[str, Any]], sampled: set[int], stop: str) -> Any:
        """A verifiers ``Trace`` of one conversation (OpenAI chat messages): a chain of message nodes, the
        model's turns (indices ``sampled``) sampled."""
        from pydantic import TypeAdapter
        from verifiers.v1.configs.agent import AgentConfig
        from verifiers.v1.graph import MessageNode
        from verifiers.v1.trace import AgentInfo, Trace, TraceTask
        from verifiers.v1.types import Message

        adapter: TypeAdapter[Any] = TypeAdapter(Message)
        nodes = [
            MessageNode(
                parent=i - 1 if i else None,
                message=adapter.validate_python(_vf_message(m)),
                sampled=i in sampled,
            )
            for i, m in enumerate(messages)
        ]
        return Trace(
            task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            agent=AgentInfo(config=AgentConfig()),
            nodes=nodes,
            is_completed=True,
            ok=True,
            stop_condition=stop,
        )

    async def _tools(self, task: Any) -> dict[str, tuple[Any, dict[str, Any]]]:
        """The task's tools, in process: ``{name: (bound method, OpenAI schema)}``, named as verifiers'
        harnesses name them (``<server>_<tool>``). Per-task toolsets are fresh per rollout (``setup``
        and ``setup_task`` run); the taskset's shared ones are set up once."""
        from verifiers.v1.utils.decorators import discover_decorated

        from telescope.core.env.tool_schema import func_to_tool_schema

        if self._shared is None:
            self._shared = list(self.taskset.toolsets(self.taskset.config))
            for server in self._shared:
                await server.setup()
        servers = list(type(task).toolsets(task.config))
        for server in servers:
            await server.setup()
            await server.setup_task(task)
        tools: dict[str, tuple[Any, dict[str, Any]]] = {}
        for server in [*self._shared, *servers]:
            for fn in discover_decorated(server, "tool"):
                raw = getattr(fn, "tool_name", None) or fn.__name__
                full = f"{server.server_name}_{raw}" if server.server_name else raw
                schema = func_to_tool_schema(fn)
                schema["function"]["name"] = full
                tools[full] = (fn, schema)
        return tools

    @staticmethod
    async def _call_tool(tools: dict[str, tuple[Any, dict[str, Any]]], name: str, arguments: str) -> str:
        """A tool's result as text; a bad call or a failing tool is the model's observation, as in
        verifiers' harnesses."""
        if name not in tools:
            return f"Error: unknown tool '{name}'; tools: {', '.join(tools) or '(none)'}"
        try:
            args = json.loads(arguments or "{}")
            result = tools[name][0](**args)
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:  # noqa: BLE001 - returned to the model, like an MCP tool error
            return f"Error: {type(exc).__name__}: {exc}"
        return result if isinstance(result, str) else json.dumps(result, default=str)

    async def run_agent(self, client: Any, model: str, sample: Sample) -> RewardResult:
        """The task's conversation through the gateway: one call, or a tool loop while the model calls the
        task's tools (up to ``max_turns`` calls); then the task's own scoring of the trace."""
        kw: VerifiersKwargs = self.kwargs  # type: ignore[assignment]
        task = self._tasks[sample.metadata["index"]]
        tools = await self._tools(task)
        messages = self.initial_messages(task)
        sampled: set[int] = set()
        stop = "max_turns"
        for _ in range(kw.max_turns):
            extra = {"tools": [schema for _, schema in tools.values()]} if tools else {}
            reply = await client.chat.completions.create(model=model, messages=messages, **extra)
            choice = reply.choices[0]
            calls = list(choice.message.tool_calls or [])
            message: dict[str, Any] = {"role": "assistant", "content": choice.message.content or ""}
            if calls:
                message["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.function.name, "arguments": c.function.arguments},
                    }
                    for c in calls
                ]
            sampled.add(len(messages))
            messages.append(message)
            if not calls:
                stop = str(choice.finish_reason)
                break
            for call in calls:
                content = await self._call_tool(tools, call.function.name, call.function.arguments)
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "name": call.function.name, "content": content}
                )
        trace = self.build_trace(task, messages, sampled, stop)
        await task.score(trace)
        metrics = {name: float(r.score) for name, r in trace.rewards.items() if r is not None}
        metrics.update({name: float(v) for name, v in trace.metrics.items() if v is not None})
        metrics["unscored_rewards"] = float(sum(r is None for r in trace.rewards.values()))
        metrics["tool_calls"] = float(sum(len(m.get("tool_calls", [])) for m in messages))
        return RewardResult(float(trace.reward), metrics)
