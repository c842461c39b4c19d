"""Digit-string manipulation: ``"sort:3142="`` -> ``"1234"`` and ``"rev:3142="`` -> ``"2413"``."""

from __future__ import annotations

import random
from collections.abc import Callable

from schedrl.envs.base import GeneratedTasks, Task, check_int_range, check_order, exact_match, task_id

_MAX_LEN = 10_000


class DigitsTask(GeneratedTasks):
    """A random digit string of length uniform in ``[min_len, max_len]``, transformed by ``op``."""

    tag: str
    op: Callable[[str], str]

    def __init__(self, min_len: int = 4, max_len: int = 8) -> None:
        self.min_len = check_int_range(self.name, "min_len", min_len, 1, _MAX_LEN)
        self.max_len = check_int_range(self.name, "max_len", max_len, 1, _MAX_LEN)
        check_order(self.name, "min_len", min_len, "max_len", max_len)

    def candidate(self, rng: random.Random) -> Task:
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(self.min_len, self.max_len)))
        prompt = f"{self.tag}:{digits}="
        answer = type(self).op(digits)
        return Task(id=task_id(self.tag, prompt), prompt=prompt, answer=answer, domain=self.name)

    def reward(self, task: Task, completion: str) -> float:
        return exact_match(task, completion)


def _sort(digits: str) -> str:
    return "".join(sorted(digits))


def _reverse(digits: str) -> str:
    return digits[::-1]


class SortDigitsTask(DigitsTask):
    """Sort the digits ascending; reward is an exact string match."""

    name = "sort"
    tag = "sort"
    op = staticmethod(_sort)


class ReverseDigitsTask(DigitsTask):
    """Reverse the digit string; reward is an exact string match."""

    name = "reverse"
    tag = "rev"
    op = staticmethod(_reverse)
