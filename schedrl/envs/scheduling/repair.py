"""Repair turns on a scheduling text task: an infeasible answer gets the verifier's first violation
back, and the model answers again.

R-ConstraintBench scores one answer; a scheduler in use gets told what broke. `RepairEnv` wraps any
`GradedTask` (`rcpsp` first: its verifier names the constraint, "precedence: activity 4 starts at 3,
before activity 2 ends at 8"). Each model turn is a whole answer, ended by the end-of-sequence
token as in the single-turn task. The environment judges it:

- feasible (or the last of `max_attempts`): the episode ends with the task's reward for this answer,
  times `repair_discount` per earlier attempt, so a first-time answer is worth the most;
- otherwise the observation is the violation and the answer cue again (rcpsp: "\\nprecedence: ...
  \\nstarts="), as context the model is not trained on.

`info` carries the attempts used and the first violation's kind.
"""

from __future__ import annotations

from schedrl.envs.base import Task, TaskSource
from schedrl.envs.environment import Observation, StepResult
from schedrl.envs.scheduling.graded import GradedTask, Verdict


def answer_cue(prompt: str) -> str:
    """What the model answers after: the prompt's last line if it has several ("starts="), else "="."""
    return prompt.rsplit("\n", 1)[1] if "\n" in prompt else "="


class RepairEnv:
    """Up to `max_attempts` answers to one scheduling task, each infeasible one answered with its
    first violated constraint."""

    stop_strings: tuple[str, ...] = ()

    def __init__(self, source: TaskSource, max_attempts: int = 3, repair_discount: float = 1.0) -> None:
        if not isinstance(source, GradedTask):
            raise ValueError(
                f"environment 'repair': task {getattr(source, 'name', source)!r} has no verifier that "
                "names violations; use a scheduling task (rcpsp, activity, lis, jssp_text)"
            )
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError(f"environment 'repair': max_attempts must be an int >= 1, got {max_attempts!r}")
        if not 0.0 < repair_discount <= 1.0:
            raise ValueError(
                f"environment 'repair': repair_discount must be in (0, 1], got {repair_discount!r}"
            )
        self.source, self.max_attempts, self.repair_discount = source, max_attempts, repair_discount
        self.task: Task | None = None
        self.attempts = 0
        self.first: Verdict | None = None

    async def reset(self, task: Task, seed: int) -> Observation:
        self.task, self.attempts, self.first = task, 0, None
        return Observation(task.prompt, "template")

    async def step(self, action: str) -> StepResult:
        if self.task is None:
            raise RuntimeError("RepairEnv.step before reset")
        self.attempts += 1
        verdict = self.source.judge(self.task, action)
        self.first = self.first or verdict
        info = {"attempts": self.attempts, "first_violation": self.first.kind}
        if verdict.feasible or self.attempts >= self.max_attempts:
            reward = self.source.grade(verdict) * self.repair_discount ** (self.attempts - 1)
            return StepResult(None, reward, done=True, truncated=not verdict.feasible, info=info)
        feedback = f"\n{verdict.violation}\n{answer_cue(self.task.prompt)}"
        return StepResult(Observation(feedback, "env"), None, done=False, info=info)

    async def close(self) -> None:
        return None
