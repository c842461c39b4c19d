"""`linear_code`: write the body of a small Python function, scored by hidden unit tests in the sandbox.

``"f(x)=3x+1 def f(x): return "`` -> the model writes ``3*x+1``; the reward runs ``def f(x): return
<completion>`` against hidden tests (``f(0) == 1``, ``f(5) == 16``, ...) in the sandbox, all or
nothing, or the fraction passed with ``partial=True``. Difficulty knob: the coefficient range
(`max_coef`) and the forms (``a*x+b``, ``a*x-b``, ``(x+b)*a``).

It needs the sandbox (root, namespaces): model-written code never runs outside it.
"""

from __future__ import annotations

import random

from schedrl.envs.base import GeneratedTasks, Task, check_int_range, task_id

FORMS = (  # (Python body, the formula as the prompt shows it, its value)
    ("{a}*x+{b}", "{a}x+{b}", lambda a, b, x: a * x + b),
    ("{a}*x-{b}", "{a}x-{b}", lambda a, b, x: a * x - b),
    ("(x+{b})*{a}", "(x+{b}){a}", lambda a, b, x: (x + b) * a),
)
PROBES = (0, 1, 2, 5, 11, -3)


class LinearCodeTask(GeneratedTasks):
    """A linear function given by its formula; the model writes it as Python."""

    name = "linear_code"
    reward_workers = 4  # rewards wait on the sandbox: score a step's samples four at a time

    def __init__(self, max_coef: int = 9, partial: bool = False) -> None:
        self.max_coef = check_int_range(self.name, "max_coef", max_coef, 1, 999)
        self.partial = partial

    def candidate(self, rng: random.Random) -> Task:
        a, b = rng.randint(1, self.max_coef), rng.randint(0, self.max_coef)
        body, shown, value = FORMS[rng.randrange(len(FORMS))]
        prompt = f"f(x)={shown.format(a=a, b=b)} def f(x): return "
        tests = [f"f({x}) == {value(a, b, x)}" for x in PROBES]
        return Task(
            task_id(self.name, prompt), prompt, body.format(a=a, b=b), self.name, metadata={"tests": tests}
        )

    def reward(self, task: Task, completion: str) -> float:
        from schedrl.sandbox.unit_tests import run_tests

        line = completion.strip().splitlines()[0] if completion.strip() else ""
        return run_tests(f"def f(x):\n    return {line}", task.metadata["tests"], partial=self.partial)
