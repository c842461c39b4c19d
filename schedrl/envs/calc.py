"""`calc`: multi-digit arithmetic that the tiny model cannot do alone, with a calculator tool.

``"347*86="`` -> the model calls ``<<calc 347*86>>``, the tool answers ``[29842]``, and the model
ends its turn with ``29842``. The reward reads the text after the last tool result (or the whole
completion when no tool was called) as an integer: exact match. The supervised warm-up trains on
that whole tool-use trace (`solution`); in RL the tool's answer comes from the tool.

Difficulty knob: the operands' digit counts (`min_digits`, `max_digits`) and the operators.
"""

from __future__ import annotations

import random

from schedrl.envs.addition import operand, parse_integer
from schedrl.envs.base import GeneratedTasks, Task, check_int_range, check_order, task_id
from schedrl.envs.safe_arith import parse

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def calc(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: integers with + - * / and parentheses, e.g. 347*86
    """
    value = parse(expression)[0]
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def final_answer(completion: str) -> str:
    """The text after the last tool result ``[...]``: what the model answered in the end."""
    return completion.rsplit("]", 1)[-1].strip()


class CalcTask(GeneratedTasks):
    """`a op b` with multi-digit operands; solved exactly by calling the calculator tool."""

    name = "calc"

    def __init__(self, min_digits: int = 3, max_digits: int = 4, ops: str = "*") -> None:
        self.min_digits = check_int_range(self.name, "min_digits", min_digits, 1, 12)
        self.max_digits = check_int_range(self.name, "max_digits", max_digits, 1, 12)
        check_order(self.name, "min_digits", min_digits, "max_digits", max_digits)
        if not ops or any(op not in _OPS for op in ops):
            raise ValueError(f"task 'calc': ops must be made of {''.join(_OPS)}, got {ops!r}")
        self.ops = ops

    def candidate(self, rng: random.Random) -> Task:
        a = operand(rng, self.min_digits, self.max_digits)
        b = operand(rng, self.min_digits, self.max_digits)
        op = rng.choice(self.ops)
        prompt = f"{a}{op}{b}="
        return Task(id=task_id("calc", prompt), prompt=prompt, answer=str(_OPS[op](a, b)), domain=self.name)

    def reward(self, task: Task, completion: str) -> float:
        value = parse_integer(final_answer(completion))
        return float(value is not None and value == int(task.answer))

    def solution(self, task: Task) -> str:
        """The tool-use trace: the call, the tool's answer, the final answer."""
        expression = task.prompt.removesuffix("=")
        return f"<<calc {expression}>>[{task.answer}]{task.answer}"
