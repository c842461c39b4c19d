"""The longest strictly increasing subsequence, `"lis:31475="` -> `"147"`.

Values are digits (`max_value` <= 9: the prompt and the answer are digit strings) or numbers up
to `max_value` (comma-separated). Instances are drawn until their longest increasing subsequence
is unique as a sequence of values, so `exact` has one right answer.

Difficulty: sequences of `min_len`..`max_len` values. Verdicts: anything but digits (and commas
in the comma format) is a parse error; values that are not a subsequence of the input, or that
do not strictly increase, are infeasible, named in that order.
"""

from __future__ import annotations

import random
from itertools import combinations

from schedrl.envs.base import Task, check_int_range, check_order, task_id
from schedrl.envs.scheduling.graded import PARSE_ERROR, GradedTask, Verdict, check_reward, parse_ints

MAX_LEN = 16  # the uniqueness check enumerates subsequences


def longest(values: list[int]) -> tuple[int, set[tuple[int, ...]]]:
    """The length of a longest strictly increasing subsequence, and every one (as value tuples)."""
    best = [1] * len(values)  # O(n^2) DP for the length
    for i in range(len(values)):
        for j in range(i):
            if values[j] < values[i]:
                best[i] = max(best[i], best[j] + 1)
    n = max(best, default=0)
    seqs = set()
    for idx in combinations(range(len(values)), n):
        seq = tuple(values[i] for i in idx)
        if all(a < b for a, b in zip(seq, seq[1:], strict=False)):
            seqs.add(seq)
    return n, seqs


def is_subsequence(seq: list[int], values: list[int]) -> bool:
    it = iter(values)
    return all(any(v == x for v in it) for x in seq)


class LISTask(GradedTask):
    """Answer a longest strictly increasing subsequence; `reward` is exact, feasible_size or gap."""

    name = "lis"
    violations = ("subsequence", "increasing")

    def __init__(self, min_len: int = 4, max_len: int = 6, max_value: int = 9, reward: str = "gap") -> None:
        self.min_len = check_int_range(self.name, "min_len", min_len, 2, MAX_LEN)
        self.max_len = check_int_range(self.name, "max_len", max_len, 2, MAX_LEN)
        check_order(self.name, "min_len", min_len, "max_len", max_len)
        self.max_value = check_int_range(self.name, "max_value", max_value, 1, 10**6)
        self.reward_mode = check_reward(self.name, reward)

    def _write(self, values) -> str:
        return "".join(map(str, values)) if self.max_value <= 9 else ",".join(map(str, values))

    def _read(self, text: str) -> list[int] | None:
        if self.max_value <= 9:
            return [int(c) for c in text] if text.isdigit() and text.isascii() else None
        return parse_ints(text)

    def candidate(self, rng: random.Random) -> Task | None:
        values = [rng.randint(0, self.max_value) for _ in range(rng.randint(self.min_len, self.max_len))]
        _, seqs = longest(values)
        if len(seqs) != 1:
            return None
        prompt = f"lis:{self._write(values)}="
        (answer,) = seqs
        return Task(
            task_id("lis", prompt), prompt, self._write(answer), self.name, difficulty=float(len(values))
        )

    def verify(self, task: Task, completion: str) -> Verdict:
        seq = self._read(completion)
        if seq is None:
            return PARSE_ERROR
        values = self._read(task.prompt.removeprefix("lis:").removesuffix("="))
        assert values is not None
        if not is_subsequence(seq, values):
            return Verdict(
                True, violation=f"subsequence: {self._write(seq)} is not a subsequence of the input"
            )
        for a, b in zip(seq, seq[1:], strict=False):
            if a >= b:
                return Verdict(True, violation=f"increasing: {a} is followed by {b}")
        optimum = len(self._read(task.answer) or ())
        return Verdict(True, True, quality=len(seq) / optimum, optimal=self._write(seq) == task.answer)
