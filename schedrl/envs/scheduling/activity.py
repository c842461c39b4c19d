"""Activity selection: the most pairwise-compatible activities, `"act:a1-3,b2-5,c4-7="` -> `"ac"`.

Activity `a1-3` runs over the half-open interval [1, 3): two activities are compatible when one
ends before or when the other starts. The answer names a largest compatible set by its letters,
in any order. Instances are drawn until their largest compatible set is unique (the greedy
earliest-finish rule finds one; enumeration checks there is no other of the same size), so
`exact` has one right answer.

Difficulty: `min_n`..`max_n` activities over times 0..`horizon`. Verdicts: a completion with a
character that is not a letter is a parse error; a letter naming no activity, a repeated letter
or two overlapping activities is infeasible, named in that order.
"""

from __future__ import annotations

import random
from itertools import combinations
from string import ascii_lowercase

from schedrl.envs.base import Task, check_int_range, check_order, task_id
from schedrl.envs.scheduling.graded import PARSE_ERROR, GradedTask, Verdict, check_reward

MAX_ACTIVITIES = 12  # the uniqueness check enumerates subsets


def parse_prompt(prompt: str) -> dict[str, tuple[int, int]]:
    """`"act:a1-3,b2-5="` -> {"a": (1, 3), "b": (2, 5)}."""
    body = prompt.removeprefix("act:").removesuffix("=")
    out = {}
    for item in body.split(","):
        start, end = item[1:].split("-")
        out[item[0]] = (int(start), int(end))
    return out


def compatible(spans: list[tuple[int, int]]) -> bool:
    spans = sorted(spans)
    return all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))


def largest_sets(acts: dict[str, tuple[int, int]]) -> tuple[int, list[str]]:
    """The size of a largest compatible set, and every set of that size (letters sorted)."""
    best, end = 0, -1
    for s, e in sorted(acts.values(), key=lambda x: x[1]):  # earliest finish first: the optimum size
        if s >= end:
            best, end = best + 1, e
    sets = ["".join(c) for c in combinations(sorted(acts), best) if compatible([acts[x] for x in c])]
    return best, sets


class ActivityTask(GradedTask):
    """Pick a largest set of compatible activities; `reward` is exact, feasible_size or gap."""

    name = "activity"
    violations = ("unknown", "duplicate", "overlap")

    def __init__(self, min_n: int = 3, max_n: int = 4, horizon: int = 9, reward: str = "gap") -> None:
        self.min_n = check_int_range(self.name, "min_n", min_n, 2, MAX_ACTIVITIES)
        self.max_n = check_int_range(self.name, "max_n", max_n, 2, MAX_ACTIVITIES)
        check_order(self.name, "min_n", min_n, "max_n", max_n)
        self.horizon = check_int_range(self.name, "horizon", horizon, 2, 999)
        self.reward_mode = check_reward(self.name, reward)

    def candidate(self, rng: random.Random) -> Task | None:
        n = rng.randint(self.min_n, self.max_n)
        acts = {}
        for letter in ascii_lowercase[:n]:
            start = rng.randrange(self.horizon)
            acts[letter] = (start, rng.randint(start + 1, self.horizon))
        size, sets = largest_sets(acts)
        if len(sets) != 1:
            return None
        prompt = "act:" + ",".join(f"{k}{s}-{e}" for k, (s, e) in acts.items()) + "="
        return Task(
            task_id("act", prompt), prompt, sets[0], self.name, difficulty=float(n), metadata={"size": size}
        )

    def verify(self, task: Task, completion: str) -> Verdict:
        if not all(c in ascii_lowercase for c in completion):
            return PARSE_ERROR
        acts = parse_prompt(task.prompt)
        for c in completion:
            if c not in acts:
                return Verdict(True, violation=f"unknown: activity {c!r} is not in the instance")
        seen = set()
        for c in completion:
            if c in seen:
                return Verdict(True, violation=f"duplicate: activity {c!r} is chosen twice")
            seen.add(c)
        chosen = sorted(completion, key=lambda c: acts[c])
        for x, y in zip(chosen, chosen[1:], strict=False):
            if acts[x][1] > acts[y][0]:
                return Verdict(
                    True, violation=f"overlap: {x}{acts[x][0]}-{acts[x][1]} and {y}{acts[y][0]}-{acts[y][1]}"
                )
        optimum = len(task.answer)
        return Verdict(
            True, True, quality=len(completion) / optimum, optimal="".join(sorted(completion)) == task.answer
        )
