"""Per-task and per-domain success statistics, re-estimated online as the policy changes.

A task's success rate is estimated from its own (decayed) counts, shrunk toward its domain's
rate, because most tasks are seen only a few times in a short run:

    p_domain = (s_d + 1) / (n_d + 2)                             (Laplace)
    p_task   = (s_t + k * p_domain) / (n_t + k)                  (k = prior_weight)

When a task is observed again its old counts are multiplied by ``decay`` first, and every
domain's counts by ``domain_decay`` once per update (one training step), so the estimates follow
the current policy rather than the whole history.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from schedrl.envs import Task

if TYPE_CHECKING:
    from schedrl.data.base import ScoredGroup


class TaskStats:
    """Decayed success counts per task id and per domain; JSON state."""

    def __init__(self, prior_weight: float = 4.0, decay: float = 0.5, domain_decay: float = 0.8) -> None:
        self.prior_weight, self.decay, self.domain_decay = prior_weight, decay, domain_decay
        self.tasks: dict[str, list[float]] = {}  # id -> [successes, trials, last accuracy, last step seen]
        self.domains: dict[str, list[float]] = {}  # domain -> [successes, trials]

    def update(self, groups: Sequence[ScoredGroup], step: int) -> None:
        for d in self.domains.values():
            d[0], d[1] = self.domain_decay * d[0], self.domain_decay * d[1]
        for g in groups:
            n, s = len(g.rewards), g.accuracy * len(g.rewards)
            t = self.tasks.setdefault(g.task.id, [0.0, 0.0, 0.0, 0])
            t[0], t[1], t[2], t[3] = self.decay * t[0] + s, self.decay * t[1] + n, g.accuracy, step
            d = self.domains.setdefault(g.task.domain, [0.0, 0.0])
            d[0], d[1] = d[0] + s, d[1] + n

    def domain_p(self, domain: str) -> float:
        s, n = self.domains.get(domain, (0.0, 0.0))
        return (s + 1.0) / (n + 2.0)

    def p(self, task: Task) -> float:
        """Estimated success rate of ``task`` under the current policy, in (0, 1)."""
        s, n = self.tasks.get(task.id, (0.0, 0.0))[:2]
        k = self.prior_weight
        return (s + k * self.domain_p(task.domain)) / (n + k)

    def seen(self, task: Task) -> bool:
        return task.id in self.tasks

    def last_accuracy(self, task: Task) -> float | None:
        t = self.tasks.get(task.id)
        return None if t is None else t[2]

    def last_step(self, task: Task) -> int | None:
        t = self.tasks.get(task.id)
        return None if t is None else int(t[3])

    def state_dict(self) -> dict[str, Any]:
        return {
            "tasks": {k: list(v) for k, v in self.tasks.items()},
            "domains": {k: list(v) for k, v in self.domains.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tasks = {
            k: [float(v[0]), float(v[1]), float(v[2]), int(v[3])] for k, v in state["tasks"].items()
        }
        self.domains = {k: [float(v[0]), float(v[1])] for k, v in state["domains"].items()}
