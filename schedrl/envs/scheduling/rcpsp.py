"""Project scheduling feasibility in the style of R-ConstraintBench: give every activity a start time.

An instance is a layered DAG of activities (`levels` x `width`), each with a duration and a
resource, under four kinds of constraint, each with its own knob:

- `precedences` per level: that many distinct arcs from the level before (arcs between adjacent
  levels are never implied by others, so none is redundant);
- `downtimes`: windows [a, b) in which a resource runs nothing;
- `windows`: activities that must start at or after a release time and end by a deadline;
- `disjunctive`: pairs of activities that may not overlap (a shared crew).

Instances are built around a hidden schedule that meets every constraint, so each is feasible.
The prompt is one line per kind (an empty kind is left out), ending with `starts=`; the answer
is the start times, comma-separated, activity by activity. The verifier checks the kinds in the
order above and names the first violated constraint (for metrics, and for a repair turn). Reward
`feasible` is 1 for a feasible schedule, else 0; `partial` is the fraction of constraints met
(1 only when all are). Anything but comma-separated numbers, one per activity, is a parse error.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from schedrl.envs.base import Task, check_int_range, task_id
from schedrl.envs.scheduling.graded import PARSE_ERROR, GradedTask, Verdict, parse_ints

RCPSP_REWARDS = ("feasible", "partial")


@dataclass
class Project:
    durations: list[int]
    resources: list[int]
    precedences: list[tuple[int, int]]  # (before, after)
    downtimes: list[tuple[int, int, int]]  # (resource, start, end)
    windows: list[tuple[int, int, int]]  # (activity, release, deadline)
    disjunctive: list[tuple[int, int]]

    def write(self) -> str:
        lines = [
            "rcpsp",
            "durations: " + " ".join(map(str, self.durations)),
            "resources: " + " ".join(map(str, self.resources)),
        ]
        if self.precedences:
            lines.append("precedence: " + " ".join(f"{a}<{b}" for a, b in self.precedences))
        if self.downtimes:
            lines.append("downtime: " + " ".join(f"r{r}@{a}-{b}" for r, a, b in self.downtimes))
        if self.windows:
            lines.append("window: " + " ".join(f"{i}@{a}-{b}" for i, a, b in self.windows))
        if self.disjunctive:
            lines.append("disjunctive: " + " ".join(f"{a}~{b}" for a, b in self.disjunctive))
        return "\n".join(lines) + "\nstarts="

    @classmethod
    def read(cls, prompt: str) -> Project:
        fields = dict(line.split(": ", 1) for line in prompt.splitlines()[1:-1])

        def pairs(key: str, sep: str) -> list[tuple[int, int]]:
            return [(int(a), int(b)) for a, b in (p.split(sep) for p in fields.get(key, "").split())]

        def spans(key: str, strip: str = "") -> list[tuple[int, int, int]]:
            out = []
            for item in fields.get(key, "").split():
                who, span = item.split("@")
                a, b = span.split("-")
                out.append((int(who.removeprefix(strip)), int(a), int(b)))
            return out

        return cls(
            [int(x) for x in fields["durations"].split()],
            [int(x) for x in fields["resources"].split()],
            pairs("precedence", "<"),
            spans("downtime", "r"),
            spans("window"),
            pairs("disjunctive", "~"),
        )

    @property
    def num_constraints(self) -> int:
        return len(self.precedences) + len(self.downtimes) + len(self.windows) + len(self.disjunctive)

    def violations(self, starts: list[int]) -> list[str]:
        """Every violated constraint, kind by kind in the order of the module docstring."""
        end = [s + d for s, d in zip(starts, self.durations, strict=True)]
        out = []
        for a, b in self.precedences:
            if starts[b] < end[a]:
                out.append(
                    f"precedence: activity {b} starts at {starts[b]}, before activity {a} ends at {end[a]}"
                )
        for r, lo, hi in self.downtimes:  # one message per window: the first activity that runs into it
            for i, res in enumerate(self.resources):
                if res == r and starts[i] < hi and lo < end[i]:
                    out.append(
                        f"downtime: activity {i} runs on resource {r} over [{starts[i]}, {end[i]}), into its "
                        f"downtime [{lo}, {hi})"
                    )
                    break
        for i, lo, hi in self.windows:
            if starts[i] < lo or end[i] > hi:
                out.append(
                    f"window: activity {i} runs over [{starts[i]}, {end[i]}), outside its window [{lo}, {hi})"
                )
        for a, b in self.disjunctive:
            if starts[a] < end[b] and starts[b] < end[a]:
                out.append(f"disjunctive: activities {a} and {b} overlap")
        return out


class RCPSPTask(GradedTask):
    """Feasible start times for a constrained project; `reward` is feasible or partial."""

    name = "rcpsp"
    violations = ("count", "precedence", "downtime", "window", "disjunctive")

    def __init__(
        self,
        levels: int = 3,
        width: int = 2,
        precedences: int = 2,
        downtimes: int = 0,
        windows: int = 0,
        disjunctive: int = 0,
        resources: int = 2,
        max_duration: int = 5,
        reward: str = "feasible",
    ) -> None:
        self.levels = check_int_range(self.name, "levels", levels, 1, 20)
        self.width = check_int_range(self.name, "width", width, 1, 20)
        self.precedences = check_int_range(self.name, "precedences", precedences, 0, width * width)
        if levels == 1 and precedences:
            raise ValueError(f"task 'rcpsp': precedences must be 0 with a single level, got {precedences}")
        n = levels * width
        self.windows = check_int_range(self.name, "windows", windows, 0, n)
        self.disjunctive = check_int_range(self.name, "disjunctive", disjunctive, 0, n * (n - 1) // 2)
        self.resources = check_int_range(self.name, "resources", resources, 1, 10)
        self.downtimes = check_int_range(self.name, "downtimes", downtimes, 0, 4 * resources)
        self.max_duration = check_int_range(self.name, "max_duration", max_duration, 1, 99)
        if reward not in RCPSP_REWARDS:
            raise ValueError(f"task 'rcpsp': reward must be feasible or partial, got {reward!r}")
        self.reward_mode = reward

    def candidate(self, rng: random.Random) -> Task | None:
        w, n = self.width, self.levels * self.width
        durations = [rng.randint(1, self.max_duration) for _ in range(n)]
        resources = [rng.randrange(self.resources) for _ in range(n)]
        arcs = []
        for lvl in range(1, self.levels):
            pool = [(a, b) for a in range((lvl - 1) * w, lvl * w) for b in range(lvl * w, (lvl + 1) * w)]
            arcs += rng.sample(pool, self.precedences)
        # the hidden schedule: each activity after its predecessors, with a little random slack
        starts = [0] * n
        for i in range(n):
            ready = max((starts[a] + durations[a] for a, b in arcs if b == i), default=0)
            starts[i] = ready + rng.randint(0, 2)
        end = [s + d for s, d in zip(starts, durations, strict=True)]
        horizon = max(end) + 3
        downtimes = []
        for _ in range(self.downtimes):  # an idle gap of a resource in the hidden schedule
            r = rng.randrange(self.resources)
            busy = sorted((starts[i], end[i]) for i in range(n) if resources[i] == r)
            gaps, t = [], 0
            for s, e in busy:
                if s > t:
                    gaps.append((t, s))
                t = max(t, e)
            gaps.append((t, horizon))
            lo, hi = rng.choice(gaps)
            a = rng.randint(lo, hi - 1)
            downtimes.append((r, a, rng.randint(a + 1, hi)))
        windows = [
            (i, max(0, starts[i] - rng.randint(0, 3)), end[i] + rng.randint(0, 3))
            for i in sorted(rng.sample(range(n), self.windows))
        ]
        apart = [
            (a, b) for a in range(n) for b in range(a + 1, n) if end[a] <= starts[b] or end[b] <= starts[a]
        ]
        if len(apart) < self.disjunctive:
            return None
        project = Project(
            durations, resources, arcs, downtimes, windows, sorted(rng.sample(apart, self.disjunctive))
        )
        assert not project.violations(starts)
        prompt = project.write()
        return Task(
            task_id("rcpsp", prompt),
            prompt,
            ",".join(map(str, starts)),
            self.name,
            difficulty=float(project.num_constraints),
        )

    def verify(self, task: Task, completion: str) -> Verdict:
        starts = parse_ints(completion)
        if starts is None:
            return PARSE_ERROR
        project = Project.read(task.prompt)
        if len(starts) != len(project.durations):
            return Verdict(
                True, violation=f"count: {len(starts)} start times for {len(project.durations)} activities"
            )
        broken = project.violations(starts)
        if broken:  # quality: the fraction of constraints met
            return Verdict(True, violation=broken[0], quality=1 - len(broken) / project.num_constraints)
        return Verdict(True, True, quality=1.0, optimal=True)

    def grade(self, verdict: Verdict) -> float:
        if self.reward_mode == "feasible" or not verdict.parsed:
            return float(verdict.feasible)
        return verdict.quality
