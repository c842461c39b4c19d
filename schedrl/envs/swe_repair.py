"""`swe_repair` (SWE-RL's task, generated and reduced to one file): a small module with one bug and a
failing test; the model writes the fixed line; the patched module runs against the module's tests in
the sandbox.

Each task is a module of two functions, `f(a, b)` and `g(a, b)`, one of which has a bug of one of three
kinds (an operator swapped, a constant off by one, the operands of a non-commutative operation
swapped), and tests of both functions, one of which fails. The prompt shows the module, numbered, and
the failing test; the model answers with the fixed line (``2: return a-b+1``: the line number and its
new text). The patch replaces that line and the module runs against every test in the sandbox
(`schedrl.sandbox.unit_tests`): `reward: tests` scores 1 when all pass; `reward: similarity` is SWE-RL's
reward, the similarity of the patch to the reference patch (difflib's ratio), -1 for a patch that does
not parse (Wei et al. 2025, "SWE-RL: Advancing LLM Reasoning via Reinforcement Learning on Open
Software Evolution", arXiv:2502.18449).
"""

from __future__ import annotations

import difflib
import random
import re

from schedrl.envs.base import GeneratedTasks, Task, task_id

OPS = ("+", "-", "*")
SWAP = {"+": "-", "-": "+", "*": "+"}
PATCH = re.compile(r"^\s*(\d+)\s*:\s*(.*\S)\s*$")
PROBES = ((1, 2), (3, 5), (7, 4), (0, 9), (6, 6))


def body(op: str, c: int, flip: bool) -> str:
    """`a<op>b+c`, or `b<op>a+c` with `flip`."""
    x, y = ("b", "a") if flip else ("a", "b")
    return f"return {x}{op}{y}+{c}"


def value(op: str, c: int, a: int, b: int) -> int:
    return {"+": a + b, "-": a - b, "*": a * b}[op] + c


class SWERepairTask(GeneratedTasks):
    """A one-bug module and its failing test; the model writes the fixed line (module doc)."""

    name = "swe_repair"
    reward_workers = 4  # rewards wait on the sandbox: score a step's samples four at a time

    def __init__(self, reward: str = "tests") -> None:
        if reward not in ("tests", "similarity"):
            raise ValueError(f"task 'swe_repair': reward must be 'tests' or 'similarity', got {reward!r}")
        self.reward_kind = reward

    def candidate(self, rng: random.Random) -> Task:
        funcs = []
        for _ in range(2):
            op, c = rng.choice(OPS), rng.randint(0, 9)
            funcs.append((op, c))
        buggy = rng.randrange(2)  # which function has the bug
        op, c = funcs[buggy]
        kind = rng.choice(("op", "const", "flip") if op == "-" else ("op", "const"))
        lines, fixed_line = [], ""
        for i, (fop, fc) in enumerate(funcs):
            name = "fg"[i]
            good = body(fop, fc, False)
            if i == buggy:
                bad = {
                    "op": body(SWAP[fop], fc, False),
                    "const": body(fop, fc + 1, False),
                    "flip": body(fop, fc, True),
                }[kind]
                fixed_line = f"{2 * i + 2}: {good}"
                good = bad
            lines += [f"def {name}(a,b):", f" {good}"]
        a, b = next((a, b) for a, b in PROBES if value(op, c, a, b) != self._buggy_value(op, c, kind, a, b))
        failing = f"{'fg'[buggy]}({a},{b})=={value(op, c, a, b)}"
        module = "\n".join(f"{n + 1}:{line}" for n, line in enumerate(lines))
        prompt = f"{module}\nfails: {failing}\nfix: "
        tests = [
            f"{'fg'[i]}({a},{b}) == {value(fop, fc, a, b)}"
            for i, (fop, fc) in enumerate(funcs)
            for a, b in PROBES
        ]
        source = "\n".join(lines)
        return Task(
            task_id(self.name, prompt),
            prompt,
            fixed_line,
            self.name,
            metadata={"source": source, "tests": tests},
        )

    @staticmethod
    def _buggy_value(op: str, c: int, kind: str, a: int, b: int) -> int:
        if kind == "op":
            return value(SWAP[op], c, a, b)
        if kind == "const":
            return value(op, c + 1, a, b)
        return value(op, c, b, a)

    def patched(self, task: Task, completion: str) -> str | None:
        """The module with the patch applied, or None for a patch that does not parse or names no line."""
        m = PATCH.match(completion.strip().splitlines()[0] if completion.strip() else "")
        lines = task.metadata["source"].splitlines()
        if m is None or not 1 <= int(m.group(1)) <= len(lines):
            return None
        n = int(m.group(1))
        indent = lines[n - 1][: len(lines[n - 1]) - len(lines[n - 1].lstrip())]
        lines[n - 1] = indent + m.group(2)
        return "\n".join(lines)

    def reward(self, task: Task, completion: str) -> float:
        line = completion.strip().splitlines()[0].strip() if completion.strip() else ""
        if self.reward_kind == "similarity":  # SWE-RL: how close the patch is to the reference one
            if PATCH.match(line) is None:
                return -1.0
            return difflib.SequenceMatcher(None, line, task.answer).ratio()
        source = self.patched(task, completion)
        if source is None:
            return 0.0
        from schedrl.sandbox.unit_tests import run_tests

        return run_tests(source, task.metadata["tests"])

    def solution(self, task: Task) -> str:
        return task.answer
