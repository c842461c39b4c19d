"""Sort the digits, answered inside <answer>...</answer>: a verifiers 0.4 taskset (the `verifiers.v1`
API) whose tasks reward the right answer (weight 1) and the answer's format (weight 0.2), and report the
reply's length as a metric. Its tasks are the `sort` task's prompts (`schedrl.envs.digits`), so they are
generated, not downloaded. The taskset id is this module's name."""

from __future__ import annotations

import re
from collections.abc import Iterator

import verifiers.v1 as vf  # pyright: ignore[reportMissingImports]  # the verifiers-v1 extra

from schedrl.envs import make_task

__all__ = ["SortTaskset"]

SYSTEM = "Sort the digits. Answer inside <answer></answer>."
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)


class SortData(vf.TaskData):
    answer: str


class SortTask(vf.Task[SortData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        m = ANSWER.search(trace.last_reply)
        return float(m is not None and m.group(1).strip() == self.data.answer)

    @vf.reward(weight=0.2)
    async def formatted(self, trace: vf.Trace) -> float:
        return float(ANSWER.fullmatch(trace.last_reply.strip()) is not None)

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class SortConfig(vf.TasksetConfig):
    n: int = 2000
    min_len: int = 2
    max_len: int = 3
    seed: int = 0


class SortTaskset(vf.Taskset[SortTask, SortConfig]):
    def load(self) -> Iterator[SortTask]:
        c = self.config
        source = make_task("sort", min_len=c.min_len, max_len=c.max_len)
        for t in source.sample("train", c.n, c.seed):
            yield SortTask(SortData(prompt=t.prompt, system_prompt=SYSTEM, answer=t.answer), c.task)
