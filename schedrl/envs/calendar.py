"""`calendar` (PEARL / CalConflictBench, generated): meetings booked round by round into a day that is
already partly busy, each round rewarded, with a preference stated once and remembered.

A day has hours 0-9. The episode starts with the busy hours and the user's preference, then asks for
a meeting: ``"busy 147. likes am. 2h:"``. Each model turn is a start hour ended by ``;``. The
environment books the meeting if its hours are free (then they are busy for the next rounds) and asks
for the next one: ``"ok 1h:"`` or, when it clashes, ``"clash 1h:"``. The preference is never repeated:
``am`` meetings end by 5, ``pm`` ones start at 5 or later.

Round rewards (`round_reward` each): 1 for a booking that is free and preferred, 0.5 for a free one
outside the preference, 0 for a clash or an answer that is not an hour. The last round adds the
outcome, 1 when every meeting was booked free and preferred, so the last turn's reward (what the
held-out evaluation judges) is at least 1 exactly for a perfect day. Every generated day has one
(found by search when it is drawn).

The supervised warm-up trains on the transcript of a perfect day (`solution`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from schedrl.envs.addition import parse_integer
from schedrl.envs.base import GeneratedTasks, Task, TaskSource, check_int_range, task_id
from schedrl.envs.environment import Observation, StepResult

HOURS, NOON, END = 10, 5, ";"


def fits(start: int, hours: int, busy: set[int]) -> bool:
    return start >= 0 and start + hours <= HOURS and not busy & set(range(start, start + hours))


def preferred(start: int, hours: int, likes: str) -> bool:
    return start + hours <= NOON if likes == "am" else start >= NOON


def perfect_day(busy: set[int], meetings: Sequence[int], likes: str) -> list[int] | None:
    """Starts that book every meeting free and preferred, in order (depth-first, earliest first)."""
    if not meetings:
        return []
    for s in range(HOURS):
        if fits(s, meetings[0], busy) and preferred(s, meetings[0], likes):
            rest = perfect_day(busy | set(range(s, s + meetings[0])), meetings[1:], likes)
            if rest is not None:
                return [s, *rest]
    return None


def _day(task: Task) -> tuple[set[int], list[int], str]:
    m = task.metadata
    return set(m["busy"]), list(m["meetings"]), m["likes"]


class CalendarTask(GeneratedTasks):
    """A partly busy day, a preference, and `rounds` meetings to book one per turn."""

    name = "calendar"

    def __init__(self, rounds: int = 3, max_busy: int = 3) -> None:
        self.rounds = check_int_range(self.name, "rounds", rounds, 1, 5)
        self.max_busy = check_int_range(self.name, "max_busy", max_busy, 0, 6)

    def candidate(self, rng: random.Random) -> Task | None:
        busy = set(rng.sample(range(HOURS), rng.randint(0, self.max_busy)))
        likes = rng.choice(("am", "pm"))
        meetings = [rng.choice((1, 1, 2)) for _ in range(self.rounds)]
        starts = perfect_day(busy, meetings, likes)
        if starts is None:
            return None
        prompt = f"busy {''.join(map(str, sorted(busy))) or '-'}. likes {likes}. {meetings[0]}h:"
        meta = {"busy": sorted(busy), "meetings": meetings, "likes": likes}
        key = f"{prompt}{meetings}"
        return Task(task_id("cal", key), prompt, END.join(map(str, starts)), domain=self.name, metadata=meta)

    def reward(self, task: Task, completion: str) -> float:
        """A whole transcript: 1 when its starts, in order, make a perfect day."""
        busy, meetings, likes = _day(task)
        starts = [parse_integer(p.rsplit(":", 1)[-1]) for p in completion.split(END) if p.strip()]
        if len(starts) != len(meetings):
            return 0.0
        for s, h in zip(starts, meetings, strict=True):
            if s is None or not (fits(s, h, busy) and preferred(s, h, likes)):
                return 0.0
            busy |= set(range(s, s + h))
        return 1.0

    def solution(self, task: Task) -> str:
        """The transcript of a perfect day: each start, then the environment's next request."""
        _, meetings, _ = _day(task)
        starts = task.answer.split(END)
        asks = [f"ok {h}h:" for h in meetings[1:]] + [""]
        return "".join(f"{s}{END}{ask}" for s, ask in zip(starts, asks, strict=True))


class CalendarEnv:
    """The rounds of a `CalendarTask` day: one booking per turn, a reward per round."""

    stop_strings: tuple[str, ...] = (END,)

    def __init__(self, source: TaskSource, round_reward: float = 0.2) -> None:
        if not 0.0 <= round_reward < 1.0:
            raise ValueError(f"CalendarEnv.round_reward must be in [0, 1), got {round_reward!r}")
        self.source, self.round_reward = source, round_reward
        self.busy: set[int] = set()
        self.meetings: list[int] = []
        self.likes, self.round, self.perfect = "am", 0, True

    async def reset(self, task: Task, seed: int) -> Observation:
        self.busy, self.meetings, self.likes = _day(task)
        self.round, self.perfect = 0, True
        return Observation(task.prompt, "template")

    async def step(self, action: str) -> StepResult:
        hours = self.meetings[self.round]
        start = parse_integer(action.strip().removesuffix(END))
        free = start is not None and fits(start, hours, self.busy)
        liked = free and start is not None and preferred(start, hours, self.likes)
        if free and start is not None:
            self.busy |= set(range(start, start + hours))
        self.perfect = self.perfect and liked
        reward = self.round_reward * (1.0 if liked else 0.5 if free else 0.0)
        self.round += 1
        if self.round == len(self.meetings):
            return StepResult(None, reward + float(self.perfect), done=True, info={"perfect": self.perfect})
        ask = f"{'ok' if free else 'clash'} {self.meetings[self.round]}h:"
        return StepResult(Observation(ask, "env"), reward, done=False)

    async def close(self) -> None:
        return None
