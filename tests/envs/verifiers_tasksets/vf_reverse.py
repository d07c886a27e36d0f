"""A verifiers taskset written per verifiers' docs (v1 stack): reverse a word; its rewards are its own."""

import verifiers.v1 as vf

WORDS = ["abc", "dog", "fox", "cat", "sun", "pen"]


class ReverseData(vf.TaskData):
    answer: str


class ReverseConfig(vf.TasksetConfig):
    words: list[str] = WORDS


class ReverseTask(vf.Task[ReverseData]):
    @vf.reward
    async def overlap(self, trace: vf.Trace) -> float:
        """Fraction of the answer's characters that appear in the reply."""
        reply = trace.last_reply
        return sum(c in reply for c in self.data.answer) / len(self.data.answer)

    @vf.reward(weight=0.5)
    async def exact(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == self.data.answer)

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class ReverseTaskset(vf.Taskset[ReverseTask, ReverseConfig]):
    def load(self):
        for word in self.config.words:
            yield ReverseTask(
                ReverseData(prompt=f"reverse: {word}", system_prompt="Reverse the word.", answer=word[::-1]),
                self.config.task,
            )


__all__ = ["ReverseTaskset"]
