"""Add two numbers with a tool: a verifiers `ToolEnv` whose tool is a Python function; the rubric
rewards the right final answer."""

from __future__ import annotations

import random

import verifiers as vf  # pyright: ignore[reportMissingImports]  # the verifiers extra
from datasets import Dataset


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


def load_environment(n: int = 500, seed: int = 0) -> vf.Environment:
    rng = random.Random(seed)
    pairs = [(rng.randint(10, 99), rng.randint(10, 99)) for _ in range(n)]
    rows = [{"question": f"{a}+{b}=", "answer": str(a + b)} for a, b in pairs]

    def correct(completion, answer, **kwargs) -> float:
        last = completion[-1].content if completion else ""
        return float(answer in str(last or ""))

    return vf.ToolEnv(
        tools=[add], dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[correct]), max_turns=3
    )
