"""`recall` (a long-context task for context folding): a register whose value changes now and then over
many rounds; each turn the model says what it holds now.

The episode starts with the first value, ``"set 4:"``. Each model turn is the value ended by ``;``. The
environment answers ``"set 7:"`` (a new value) or ``"same:"`` (unchanged) and asks again. The value that
holds may have been set many rounds back, so an episode folded (`task.fold`) must carry it in its
summary: the next segment shows the episode's prompt, whose value may be out of date, the summary and
the answer that waited.

Round rewards (`round_reward` each): 1 for the right value. The last round adds 1 when every round was
right, so the episode's reward is at least 1 exactly for a perfect run (what the evaluation judges).

The supervised warm-up trains on the transcript of a perfect run (`solution`), which never folds: how
to summarise, and how to read a summary, is left to reinforcement learning.
"""

from __future__ import annotations

import random

from schedrl.envs.base import GeneratedTasks, Task, TaskSource, check_int_range, task_id
from schedrl.envs.environment import Observation, StepResult

END = ";"


def _ask(value: int | None) -> str:
    return "same:" if value is None else f"set {value}:"


class RecallTask(GeneratedTasks):
    """`rounds` turns; after each but the last the value is set anew with probability `change`."""

    name = "recall"

    def __init__(self, rounds: int = 6, change: float = 0.4) -> None:
        self.rounds = check_int_range(self.name, "rounds", rounds, 2, 40)
        if not 0.0 <= change <= 1.0:
            raise ValueError(f"task 'recall': change must be in [0, 1], got {change!r}")
        self.change = change

    def candidate(self, rng: random.Random) -> Task | None:
        values = [rng.randrange(10)]
        sets: list[int | None] = [values[0]]
        for _ in range(self.rounds - 1):
            new = rng.randrange(10) if rng.random() < self.change else None
            sets.append(new)
            values.append(values[-1] if new is None else new)
        prompt = _ask(values[0])
        key = "".join("-" if v is None else str(v) for v in sets)
        meta = {"sets": sets, "key": key}
        return Task(
            task_id("recall", key), prompt, END.join(map(str, values)), domain=self.name, metadata=meta
        )

    def split_key(self, task: Task) -> str:
        """The whole run of values: ten prompts are shared by every split, the runs that follow them are not."""
        return task.metadata["key"]

    def reward(self, task: Task, completion: str) -> float:
        """A whole transcript: 1 when it names the right value in every round."""
        said = [p.rsplit(":", 1)[-1].strip() for p in completion.split(END)][: self.rounds]
        return float(said == task.answer.split(END))

    def solution(self, task: Task) -> str:
        """The transcript of a perfect run: each value, then the environment's next ask."""
        values, sets = task.answer.split(END), task.metadata["sets"]
        asks = [_ask(s) for s in sets[1:]] + [""]
        return "".join(f"{v}{END}{a}" for v, a in zip(values, asks, strict=True))


class RecallEnv:
    """The rounds of a `RecallTask`: the value asked each turn, a reward per round."""

    stop_strings: tuple[str, ...] = (END,)

    def __init__(self, source: TaskSource, round_reward: float = 0.1) -> None:
        if not 0.0 <= round_reward < 1.0:
            raise ValueError(f"RecallEnv.round_reward must be in [0, 1), got {round_reward!r}")
        self.source, self.round_reward = source, round_reward
        self.values: list[str] = []
        self.sets: list[int | None] = []
        self.round, self.perfect = 0, True

    async def reset(self, task: Task, seed: int) -> Observation:
        self.values, self.sets = task.answer.split(END), list(task.metadata["sets"])
        self.round, self.perfect = 0, True
        return Observation(task.prompt, "template")

    async def step(self, action: str) -> StepResult:
        right = action.strip().removesuffix(END).strip() == self.values[self.round]
        self.perfect = self.perfect and right
        reward = self.round_reward * float(right)
        self.round += 1
        if self.round == len(self.values):
            return StepResult(None, reward + float(self.perfect), done=True, info={"perfect": self.perfect})
        return StepResult(Observation(_ask(self.sets[self.round]), "env"), reward, done=False)

    async def close(self) -> None:
        return None
