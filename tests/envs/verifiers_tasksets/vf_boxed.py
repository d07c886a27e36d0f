"""A verifiers taskset using what the adapter refuses: a stop condition and a reward that needs a runtime box."""

import verifiers.v1 as vf


class BoxedTask(vf.Task):
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
