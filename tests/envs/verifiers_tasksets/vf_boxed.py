"""A verifiers taskset using what the adapter refuses: a stateful toolset, a stop condition and a reward that
needs a runtime box."""

import verifiers.v1 as vf


class Counter(vf.State):
    count: int = 0


class CountingTools(vf.Toolset[vf.ToolsetConfig, Counter]):
    @vf.tool
    async def bump(self) -> int:
        """Count one more."""
        self.state.count += 1
        return self.state.count


class BoxedTask(vf.Task):
    @classmethod
    def toolsets(cls, config):
        return [CountingTools(vf.ToolsetConfig())]

    @vf.stop
    async def said_done(self, trace: vf.Trace) -> bool:
        return "done" in trace.last_reply

    @vf.reward
    async def tests_pass(self, trace: vf.Trace, runtime) -> float:
        return float((await runtime.run(["pytest"], {})).exit_code == 0)


class BoxedTaskset(vf.Taskset[BoxedTask]):
    def load(self):
        yield BoxedTask(vf.TaskData(prompt="write code"), self.config.task)


__all__ = ["BoxedTaskset"]
