"""The shared shape of the scheduling text tasks: a verdict per completion, three reward variants.

A task's verifier turns a completion into a `Verdict`: did it parse, is it feasible (and if not,
the first constraint it violates), and its objective value against the instance's optimum. The
reward variant maps the verdict to a number:

    exact          1 for an optimal answer, else 0
    feasible_size  0 infeasible; a feasible answer 0.5, plus 0.5 x its quality
    gap            0 infeasible; a feasible answer its quality, 1 - (relative gap to the optimum)

Quality is `value / optimum` for a maximisation (the size of a selection), `optimum / value` for
a minimisation (a makespan), so it is 1 at the optimum and falls with the gap. Verifiers never
raise: a completion that is not a schedule at all (garbage, ten thousand characters, numbers past
any bound) is a parse error, scores 0 and is counted in the step's `parse_error_frac`.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from schedrl.envs.base import GeneratedTasks, Task

REWARDS = ("exact", "feasible_size", "gap")
MAX_COMPLETION_CHARS = 4096  # longer completions are parse errors before any parsing
MAX_NUMBER = 10**9  # a number past this in a completion is a parse error


@dataclass(frozen=True)
class Verdict:
    """What the verifier found in one completion."""

    parsed: bool
    feasible: bool = False
    violation: str | None = None  # the first violated constraint (kind: detail), when infeasible
    quality: float = 0.0  # 1 at the optimum, in (0, 1) with a gap; 0 when infeasible
    optimal: bool = False

    @property
    def kind(self) -> str | None:
        """The violated constraint's kind (`precedence`, `overlap`, ...), for metrics."""
        return None if self.violation is None else self.violation.split(":", 1)[0]


PARSE_ERROR = Verdict(parsed=False, violation="parse: not a schedule")


def check_reward(task: str, reward: str) -> str:
    if reward not in REWARDS:
        raise ValueError(f"task '{task}': reward must be one of {', '.join(REWARDS)}, got {reward!r}")
    return reward


def graded(verdict: Verdict, reward: str) -> float:
    if not verdict.feasible:
        return 0.0
    if reward == "exact":
        return float(verdict.optimal)
    if reward == "feasible_size":
        return 0.5 + 0.5 * verdict.quality
    return verdict.quality


def parse_ints(text: str, sep: str = ",") -> list[int] | None:
    """`"3,10,2"` -> [3, 10, 2]; None for anything else (empty items, signs, huge numbers)."""
    items = text.split(sep)
    if not all(s.isdigit() and s.isascii() and len(s) <= 10 for s in items):
        return None
    values = [int(s) for s in items]
    return values if all(v <= MAX_NUMBER for v in values) else None


class GradedTask(GeneratedTasks):
    """A generated scheduling problem with a verifier; `reward` is one of `REWARDS`."""

    reward_mode: str = "gap"
    violations: tuple[str, ...] = ()  # the kinds of constraint the verifier names (metrics keys)

    @abstractmethod
    def verify(self, task: Task, completion: str) -> Verdict:
        """The verdict on `completion` (already stripped, at most MAX_COMPLETION_CHARS); never raises."""

    def judge(self, task: Task, completion: str) -> Verdict:
        text = completion.strip()
        if len(text) > MAX_COMPLETION_CHARS or not text:
            return PARSE_ERROR
        try:
            return self.verify(task, text)
        except (ValueError, KeyError, IndexError, OverflowError):  # a verifier's parse slip is a parse error
            return PARSE_ERROR

    def grade(self, verdict: Verdict) -> float:
        """The reward of a verdict under this task's reward variant."""
        return graded(verdict, self.reward_mode)

    def reward(self, task: Task, completion: str) -> float:
        return self.grade(self.judge(task, completion))

    def reward_batch(
        self, tasks: Sequence[Task], completions: Sequence[str], completion_ids=None
    ) -> tuple[list[float], dict[str, float], list[str | None]]:
        """Rewards, and the step's `parse_error_frac`, `feasible_frac`, `optimal_frac` and one
        `violated/<kind>` fraction per kind of first violation."""
        verdicts = [self.judge(t, c) for t, c in zip(tasks, completions, strict=True)]
        n = max(1, len(verdicts))
        metrics = {
            "parse_error_frac": sum(not v.parsed for v in verdicts) / n,
            "feasible_frac": sum(v.feasible for v in verdicts) / n,
            "optimal_frac": sum(v.optimal for v in verdicts) / n,
        }
        for kind in self.violations:
            metrics[f"violated/{kind}"] = sum(v.parsed and v.kind == kind for v in verdicts) / n
        return [self.grade(v) for v in verdicts], metrics, [None] * len(verdicts)
