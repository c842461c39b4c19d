"""Integer addition: ``"37+45="`` -> ``"82"``."""

from __future__ import annotations

import random
import re

from schedrl.envs.base import GeneratedTasks, Task, check_int_range, check_order, task_id

_INTEGER = re.compile(r"[+-]?[0-9]+")
_MAX_DIGITS = 1000
"""Keeps answers far below Python's int-from-string limit (4300 digits)."""


def operand(rng: random.Random, min_digits: int, max_digits: int) -> int:
    """A number whose digit count is uniform in ``[min_digits, max_digits]`` (one digit includes 0)."""
    d = rng.randint(min_digits, max_digits)
    return rng.randint(0 if d == 1 else 10 ** (d - 1), 10**d - 1)


def parse_integer(text: str) -> int | None:
    """The integer in ``text`` if it is only an optional sign and ASCII digits, else ``None``."""
    text = text.strip()
    if len(text) > _MAX_DIGITS + 1 or not _INTEGER.fullmatch(text):
        return None
    return int(text)


class AdditionTask(GeneratedTasks):
    """Add two non-negative integers; reward is an exact integer match."""

    name = "addition"

    def __init__(self, min_digits: int = 1, max_digits: int = 1) -> None:
        self.min_digits = check_int_range(self.name, "min_digits", min_digits, 1, _MAX_DIGITS)
        self.max_digits = check_int_range(self.name, "max_digits", max_digits, 1, _MAX_DIGITS)
        check_order(self.name, "min_digits", min_digits, "max_digits", max_digits)

    def candidate(self, rng: random.Random) -> Task:
        a = operand(rng, self.min_digits, self.max_digits)
        b = operand(rng, self.min_digits, self.max_digits)
        prompt = f"{a}+{b}="
        return Task(id=task_id("add", prompt), prompt=prompt, answer=str(a + b), domain=self.name)

    def reward(self, task: Task, completion: str) -> float:
        value = parse_integer(completion)
        return float(value is not None and value == int(task.answer))
