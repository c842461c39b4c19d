"""`forecast` (forecasting with delayed rewards, generated): a probability for the next game of a team,
rewarded by the Brier score once the game has been played, some batches later.

A question gives a team's record and asks for the chance it wins: ``"qox won 3 of 10. p="`` ->
``"0.3"`` (a team is three random letters, so held-out questions are known records of new teams). Each question is a new event (its id carries a number drawn with it), and its outcome is
drawn once, from the record's rate, when the event resolves: o is the share of the team's next `games`
games it wins (1 for a win with `games: 1`, the Brier score's binary event). A forecast q is scored
``1 - (q - o)^2``, a proper scoring rule: its expected value, ``1 - (q - p)^2 - var(o)``, is highest at
the true rate p. More games resolve each question with less noise (var(o) = p(1 - p) / games). An answer
that is not a probability in tenths scores 0.

The outcome is not known when the sample is generated: a question resolves `resolves_in` batches after
the batch that drew it (1 to `max_delay`, drawn with it; `Task.metadata["resolves_in"]`). The training
loop holds the samples of a question, unscored, until the batch that resolves it has been drawn
(`orchestrate.loop.Loop`), so the staleness they carry when trained on is the loop's to bound: a run
needs `schedule.max_staleness >= max_delay`. The held-out evaluation does not wait for outcomes: it
scores a forecast 1 when it is the record's rate (`rule_source`, calibration), else 0.

Group-normalised advantages divide by the spread of a group's rewards, which differs by outcome, so with
`games: 1` they bend the Brier score away from proper (centre them only: `algo.std_normalize: false`).
With `games: 10` the outcome's own spread is small next to the forecasts' and the recipe normalises
(`examples/forecast.yaml`).

Reference: Turtel et al., "Outcome-based Reinforcement Learning to Predict the Future" (2025).
"""

from __future__ import annotations

import random
import re

from schedrl.envs.base import GeneratedTasks, Task, check_int_range, stable_hash, task_id

LETTERS = "abcdefghijklmnopqrstuvwxyz"
GAMES = (5, 10)
_FORECAST = re.compile(r"(0\.[0-9]|1\.0)")


def parse_forecast(text: str) -> float | None:
    """The probability in tenths ``text`` holds (``"0.3"``, ``"1.0"``), else None."""
    m = _FORECAST.fullmatch(text.strip())
    return round(float(m.group(1)), 1) if m else None


def brier_reward(q: float, outcome: float) -> float:
    """``1 - (q - o)^2``: 1 for a certain and right forecast, 0 for a certain and wrong one."""
    return 1.0 - (q - outcome) ** 2


def outcome(task: Task) -> float:
    """The share of its next `task.metadata["games"]` games the team wins: drawn from its rate, once per
    event (1 game: whether it wins the next one)."""
    rng = random.Random(stable_hash(f"outcome:{task.id}"))
    games = int(task.metadata.get("games", 1))
    return sum(rng.random() < float(task.answer) for _ in range(games)) / games


class ForecastTask(GeneratedTasks):
    """A win probability from a team's record; the Brier score of the outcome, `resolves_in` batches later."""

    name = "forecast"

    def __init__(self, max_delay: int = 2, min_delay: int = 1, games: int = 1) -> None:
        self.max_delay = check_int_range(self.name, "max_delay", max_delay, 0, 100)
        self.min_delay = check_int_range(self.name, "min_delay", min_delay, 0, self.max_delay)
        self.games = check_int_range(self.name, "games", games, 1, 1000)
        self.reward_delay = self.max_delay  # the most batches a question waits for its outcome

    def candidate(self, rng: random.Random) -> Task:
        team, games = "".join(rng.choices(LETTERS, k=3)), rng.choice(GAMES)
        wins = rng.randint(0, games)
        event = rng.randrange(10**9)
        prompt = f"{team} won {wins} of {games}. p="
        return Task(
            id=task_id("fc", f"{prompt}#{event}"),
            prompt=prompt,
            answer=f"{wins / games:.1f}",
            domain=self.name,
            metadata={"resolves_in": rng.randint(self.min_delay, self.max_delay), "games": self.games},
        )

    def reward(self, task: Task, completion: str) -> float:
        q = parse_forecast(completion)
        return 0.0 if q is None else brier_reward(q, outcome(task))

    @property
    def rule_source(self) -> Calibration:
        return Calibration(self)


class Calibration:
    """The held-out judge of `forecast`: 1 for the record's own rate, else 0 (no outcome is waited for)."""

    def __init__(self, source: ForecastTask) -> None:
        self.source = source

    def sample(self, split: str, n: int, seed: int) -> list[Task]:
        return self.source.sample(split, n, seed)

    def reward(self, task: Task, completion: str) -> float:
        q = parse_forecast(completion)
        return float(q is not None and abs(q - float(task.answer)) < 0.05)

    def solution(self, task: Task) -> str:
        return task.answer
