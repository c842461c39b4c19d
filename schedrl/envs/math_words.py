"""`math_words`: procedurally generated word problems with fraction answers, checked by math-verify.

Four templates (sharing, adding amounts, a rate, cutting a length) with numbers that grow with
`level` (1-3). The answer is an exact fraction; any equivalent form scores 1: ``7/4``,
``\\frac{7}{4}``, ``1 3/4``, ``1.75``, ``\\boxed{7/4}``. The checker reads the text after the last
``=`` or ``:`` when there is one (the model's final answer), else the whole completion, and runs
under a hard time limit (`schedrl.envs.math_check`): a hostile answer scores 0, never hangs a step.
"""

from __future__ import annotations

import random
from fractions import Fraction

from schedrl.envs.base import GeneratedTasks, Task, check_int_range, task_id
from schedrl.envs.math_check import MathChecker


def _frac(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


class MathWordTask(GeneratedTasks):
    name = "math_words"

    def __init__(self, level: int = 1, timeout_s: float = 2.0) -> None:
        self.level = check_int_range(self.name, "level", level, 1, 3)
        self.timeout_s = timeout_s
        self._checker: MathChecker | None = None

    @property
    def checker(self) -> MathChecker:
        if self._checker is None:  # the worker process starts on the first check
            self._checker = MathChecker(self.timeout_s)
        return self._checker

    def candidate(self, rng: random.Random) -> Task | None:
        top = (6, 12, 30)[self.level - 1]
        a, b, c, d = (rng.randint(1, top) for _ in range(4))
        kind = rng.randrange(4)
        if kind == 0:
            prompt, value = (
                f"{b + 1} friends share {a} pizzas equally. How much pizza does each get?",
                Fraction(a, b + 1),
            )
        elif kind == 1:
            p, q = Fraction(a, b + 1), Fraction(c, d + 1)
            prompt = (
                f"A recipe uses {_frac(p)} cup of sugar and {_frac(q)} cup of honey. How many cups is that?"
            )
            value = p + q
        elif kind == 2:
            prompt = f"A tap fills {a} liters in {b} minutes. How many liters does it fill in {c} minutes?"
            value = Fraction(a * c, b)
        else:
            prompt = f"A rope {a + c} meters long is cut into {d + 1} equal pieces. How long is each piece?"
            value = Fraction(a + c, d + 1)
        prompt += " Answer="
        return Task(id=task_id(self.name, prompt), prompt=prompt, answer=_frac(value), domain=self.name)

    def reward(self, task: Task, completion: str) -> float:
        return float(self.checker.check(task.answer, final_answer(completion)))


def final_answer(completion: str) -> str:
    """The text after the last ``=`` or ``:``, or the whole completion when it has neither."""
    cut = max(completion.rfind("="), completion.rfind(":"))
    return completion[cut + 1 :].strip() if cut >= 0 else completion.strip()
