"""`math_words`: equivalent answer forms score 1 by math-verify; hostile answers score 0 within the limit."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("math_verify", reason="the math extra: pip install 'schedrl[math]'")

from schedrl.envs import make_task  # noqa: E402
from schedrl.envs.base import Task  # noqa: E402
from schedrl.envs.math_check import MathChecker, normalize  # noqa: E402


@pytest.fixture(scope="module")
def checker():
    c = MathChecker(timeout_s=2.0)
    yield c
    c.close()


@pytest.mark.parametrize(
    ("gold", "answer", "right"),
    [
        ("7/4", "7/4", True),
        ("7/4", "\\frac{7}{4}", True),
        ("7/4", "$\\frac{7}{4}$", True),
        ("7/4", "1 3/4", True),  # a mixed number
        ("7/4", "1.75", True),
        ("7/4", "\\boxed{\\frac{7}{4}}", True),
        ("7/4", "14/8", True),
        ("3", "3", True),
        ("3", "\\frac{6}{2}", True),
        ("7/4", "4/7", False),
        ("7/4", "1 3/5", False),
        ("7/4", "1.7", False),
        ("7/4", "seven quarters", False),
        ("3", "", False),
    ],
)
def test_equivalent_forms(checker, gold, answer, right):
    assert checker.check(gold, answer) is right


HOSTILE = [
    "9" * 10_000,  # ten thousand characters (over max_chars: wrong unread)
    "10^10^10^10^10",  # a power tower
    "\\frac{" * 300 + "1" + "}" * 300,  # deep nesting
    "(" * 500,  # unbalanced
    "1/0",
    "-7/4",
    "\x00\x01\x02",
    "\\input{/etc/passwd}",
    "__import__('os').system('true')",
    "7/4" + "\\" * 50,
    "∞",
    "1e999999",
]


@pytest.mark.parametrize("answer", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_answers_score_zero_within_the_limit(checker, answer):
    checker.check("1", "1")  # warm: the worker's imports are not this answer's time
    start = time.perf_counter()
    assert checker.check("7/4", answer) is False
    assert time.perf_counter() - start < checker.timeout_s + 2.0


@pytest.mark.subprocess
def test_a_check_past_its_limit_is_cut_and_the_next_one_works(checker, monkeypatch):
    slow = MathChecker(timeout_s=1.0)
    try:
        slow.check("1", "1")
        start = time.perf_counter()
        assert slow.check("2", "2**2**2**2**2**2**2**2**2") is False
        assert time.perf_counter() - start < 4.0 and slow.timeouts == 1
        assert slow.check("7/4", "1 3/4") is True  # a fresh worker after a cut
    finally:
        slow.close()


def test_the_task_generates_disjoint_splits_with_exact_answers():
    task = make_task("math_words", level=2)
    train, held = task.sample("train", 50, 0), task.sample("eval", 20, 0)
    assert not {t.prompt for t in train} & {t.prompt for t in held}
    t = next(t for t in train if "pizzas" in t.prompt)
    n, pizzas = int(t.prompt.split()[0]), int(t.prompt.split()[3])
    from fractions import Fraction

    assert Fraction(t.answer) == Fraction(pizzas, n)
    assert task.reward(t, f"each gets = {t.answer}") == 1.0
    assert task.reward(Task("x", "p", "7/4", "d"), "Answer: \\frac{7}{4}") == 1.0
    assert task.reward(Task("x", "p", "7/4", "d"), "Answer: 2") == 0.0
    assert normalize("2 1/3 and 5") == "(2+1/3) and 5"
