"""Countdown: reach a target with the given numbers, ``"cd:3,5,7>22="`` -> ``"3*5+7"``.

Each given number may be used at most once, with + - * / and parentheses. Tasks are built
from a random expression over the numbers, so a solution always exists; the reference
answer is that expression. Simplified relative to the TV game: all numbers are drawn
uniformly from ``[1, max_number]`` and intermediate values may be fractions.
"""

from __future__ import annotations

import random
import re
from collections import Counter

from schedrl.envs import safe_arith
from schedrl.envs.base import GeneratedTasks, Task, check_int_range, check_order, task_id

_PROMPT = re.compile(r"cd:([0-9]+(?:,[0-9]+)*)>([0-9]+)=")
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}

# An expression tree node is either an int leaf or (op, left, right).
Node = int | tuple[str, "Node", "Node"]


def render(node: Node) -> str:
    """Write ``node`` with only the parentheses left-associative precedence requires."""
    if isinstance(node, int):
        return str(node)
    op, left, right = node
    lhs, rhs = render(left), render(right)
    if not isinstance(left, int) and _PRECEDENCE[left[0]] < _PRECEDENCE[op]:
        lhs = f"({lhs})"
    # a-(b+c) and a/(b*c) need parentheses even at equal precedence.
    if not isinstance(right, int) and (
        _PRECEDENCE[right[0]] < _PRECEDENCE[op] or (_PRECEDENCE[right[0]] == _PRECEDENCE[op] and op in "-/")
    ):
        rhs = f"({rhs})"
    return f"{lhs}{op}{rhs}"


def random_expression(rng: random.Random, numbers: list[int]) -> Node:
    """Combine all ``numbers`` (in a random order) into a random binary tree of operators."""
    nodes: list[Node] = list(numbers)
    rng.shuffle(nodes)
    while len(nodes) > 1:
        i = rng.randrange(len(nodes) - 1)
        nodes[i : i + 2] = [(rng.choice("+-*/"), nodes[i], nodes[i + 1])]
    return nodes[0]


def parse_prompt(prompt: str) -> tuple[list[int], int]:
    """Return the numbers and target of a countdown prompt."""
    m = _PROMPT.fullmatch(prompt)
    if m is None:
        raise ValueError(f"not a countdown prompt: {prompt!r}")
    return [int(x) for x in m.group(1).split(",")], int(m.group(2))


def verify(numbers: list[int], target: int, completion: str) -> bool:
    """True iff ``completion`` parses, uses each given number at most once and equals ``target``."""
    try:
        value, used = safe_arith.parse(completion.strip())
    except ValueError:
        return False
    return Counter(used) <= Counter(numbers) and value == target


class CountdownTask(GeneratedTasks):
    """Reach a positive integer target from 3-4 small numbers; reward checks the expression exactly."""

    name = "countdown"

    def __init__(
        self, min_numbers: int = 3, max_numbers: int = 4, max_number: int = 10, max_target: int = 1000
    ) -> None:
        self.min_numbers = check_int_range(self.name, "min_numbers", min_numbers, 2, 6)
        self.max_numbers = check_int_range(self.name, "max_numbers", max_numbers, 2, 6)
        check_order(self.name, "min_numbers", min_numbers, "max_numbers", max_numbers)
        largest = 10**safe_arith.MAX_LITERAL_DIGITS - 1
        self.max_number = check_int_range(self.name, "max_number", max_number, 1, largest)
        self.max_target = check_int_range(self.name, "max_target", max_target, 1)

    def candidate(self, rng: random.Random) -> Task | None:
        k = rng.randint(self.min_numbers, self.max_numbers)
        numbers = [rng.randint(1, self.max_number) for _ in range(k)]
        answer = render(random_expression(rng, numbers))
        try:
            value, _ = safe_arith.parse(answer)
        except ValueError:  # division by zero, e.g. 3/(2-2)
            return None
        if value.denominator != 1 or not 1 <= value <= self.max_target:
            return None
        prompt = f"cd:{','.join(map(str, numbers))}>{int(value)}="
        return Task(
            id=task_id("cd", prompt),
            prompt=prompt,
            answer=answer,
            domain=self.name,
            metadata={"numbers": numbers, "target": int(value)},
        )

    def reward(self, task: Task, completion: str) -> float:
        numbers, target = parse_prompt(task.prompt)
        return float(verify(numbers, target, completion))
