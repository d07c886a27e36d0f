"""A multi-turn verifiers taskset written per verifiers' docs (v1 stack): add two numbers with a tool from a
vf.Toolset; the reward is its own."""

import verifiers.v1 as vf


class Calculator(vf.Toolset):
    @vf.tool
    async def add(self, a: float, b: float) -> float:
        """Add two numbers.

        Args:
            a: The first number.
            b: The second number.
        """
        return a + b


class AddData(vf.TaskData):
    answer: str


class AddTask(vf.Task[AddData]):
    @classmethod
    def toolsets(cls, config):
        return [Calculator(vf.ToolsetConfig())]

    @vf.reward
    async def correct(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == self.data.answer)

    @vf.metric
    async def tool_results(self, trace: vf.Trace) -> float:
        return float(len(trace.tool_messages))


class AddTaskset(vf.Taskset[AddTask]):
    def load(self):
        for a, b in ((2, 3), (4, 5)):
            yield AddTask(AddData(prompt=f"What is {a} + {b}?", answer=str(a + b)), self.config.task)


__all__ = ["AddTaskset"]
