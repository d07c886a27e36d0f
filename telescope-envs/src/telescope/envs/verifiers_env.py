"""verifiers: a taskset of PrimeIntellect's verifiers library (its ``verifiers.v1`` stack) trained as an
agent environment. Install with ``pip install 'telescope-envs[verifiers]'`` (tested: verifiers 0.4.0).

The taskset is loaded by verifiers' own loader from its id (an installed module exporting a
``vf.Taskset``), with ``taskset_args`` validated by its own config class. Each task becomes a sample;
a rollout sends the task's system prompt and prompt to the model through the run's gateway (so every
turn is captured in token ids), records the conversation as a verifiers ``Trace`` and scores it with
the task's own ``@vf.reward`` / ``@vf.metric`` functions and the rewards and metrics its config plugs
in (``Task.score``). The reward is ``trace.reward``, the weighted sum of those rewards.

What verifiers does beyond that needs its harness programs and runtime boxes (uv, containers, MCP
servers, tunnels), which a training rollout here does not start; ``config validate`` refuses a
taskset that uses any of it, naming the feature (see ``unsupported_features``).
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

from telescope.core.env import AgentEnvironment, RewardResult, Sample
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
    servers = [*taskset.toolsets(taskset.config), *task_cls.toolsets(taskset.config.task)]
    if servers:
        kinds = ", ".join(sorted({type(s).__name__ for s in servers}))
        problems.append(f"{name}: tool servers (toolsets: {kinds}) are not supported")
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


def _message_dict(message: Any) -> dict[str, Any]:
    return message if isinstance(message, dict) else dict(message.model_dump(exclude_none=True))


class VerifiersEnvironment(AgentEnvironment):
    """A verifiers taskset: its tasks as prompts, the model through the gateway, its own scoring."""

    kwargs_model: ClassVar[type[VerifiersKwargs]] = VerifiersKwargs  # type: ignore[assignment]
    default_name = "verifiers"

    def __init__(self, kwargs: VerifiersKwargs | None = None, **extra: Any) -> None:
        super().__init__(kwargs, **extra)
        kw: VerifiersKwargs = self.kwargs  # type: ignore[assignment]
        problems = kwargs_problems(kw)
        if problems:
            raise ValueError("verifiers: " + "; ".join(problems))
        self.taskset = load_taskset(kw)
        self._tasks: list[Any] = []

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
        """A verifiers ``Trace`` of one conversation: a chain of message nodes, the model's turns sampled."""
        from pydantic import TypeAdapter
        from verifiers.v1.configs.agent import AgentConfig
        from verifiers.v1.graph import MessageNode
        from verifiers.v1.trace import AgentInfo, Trace, TraceTask
        from verifiers.v1.types import Message

        adapter: TypeAdapter[Any] = TypeAdapter(Message)
        nodes = [
            MessageNode(parent=i - 1 if i else None, message=adapter.validate_python(m), sampled=i in sampled)
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

    async def run_agent(self, client: Any, model: str, sample: Sample) -> RewardResult:
        """One chat turn through the gateway, then the task's own scoring of the trace."""
        task = self._tasks[sample.metadata["index"]]
        messages = self.initial_messages(task)
        reply = await client.chat.completions.create(model=model, messages=messages)
        choice = reply.choices[0]
        messages.append({"role": "assistant", "content": choice.message.content or ""})
        trace = self.build_trace(task, messages, {len(messages) - 1}, str(choice.finish_reason))
        await task.score(trace)
        metrics = {name: float(r.score) for name, r in trace.rewards.items() if r is not None}
        metrics.update({name: float(v) for name, v in trace.metrics.items() if v is not None})
        unscored = [name for name, r in trace.rewards.items() if r is None]
        metrics["unscored_rewards"] = float(len(unscored))
        return RewardResult(float(trace.reward), metrics)
