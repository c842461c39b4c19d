"""`guess`: find a secret number in a range from the environment's answers, over several turns.

Each model turn is one guess ended by ";" (the turn's stop string); the environment answers "+"
(the secret is higher) or "-" (lower); the right guess ends the episode with reward 1, and running
out of guesses ends it with reward 0. A binary search needs up to ceil(log2(range)) guesses, so
success takes several turns and the credit of a good first guess arrives turns later.

The supervised warm-up trains on binary-search transcripts (`solution`): "50;+75;-62;".
A single-turn completion (`reward`) is scored on its last guess.
"""

from __future__ import annotations

import random

from schedrl.envs.addition import parse_integer
from schedrl.envs.base import GeneratedTasks, Task, TaskSource, check_int_range, task_id
from schedrl.envs.environment import Observation, StepResult

HIGHER, LOWER, END = "+", "-", ";"


def guesses(completion: str) -> list[int | None]:
    """The integers of a transcript's turns (None for a turn that is not one)."""
    parts = [p.strip(HIGHER + LOWER + " ") for p in completion.split(END)]
    return [parse_integer(p) for p in parts if p]


class GuessTask(GeneratedTasks):
    """A secret integer in [0, high]; the prompt states the range."""

    name = "guess"

    def __init__(self, high: int = 63) -> None:
        self.high = check_int_range(self.name, "high", high, 1, 10**6)

    def candidate(self, rng: random.Random) -> Task:
        secret = rng.randint(0, self.high)
        # a game number independent of the secret: the prompt tells nothing about it, and the
        # train/eval split (a hash of the prompt) is a split of games
        prompt = f"guess 0-{self.high} #{rng.randint(0, 99999)}:"
        return Task(
            id=task_id("guess", f"{prompt}{secret}"), prompt=prompt, answer=str(secret), domain=self.name
        )

    def reward(self, task: Task, completion: str) -> float:
        found = guesses(completion)
        return float(bool(found) and found[-1] == int(task.answer))

    def solution(self, task: Task) -> str:
        """A binary-search transcript: each guess, then the environment's answer."""
        lo, hi, secret, out = 0, self.high, int(task.answer), []
        while True:
            g = (lo + hi) // 2
            out.append(f"{g}{END}")
            if g == secret:
                return "".join(out)
            out.append(HIGHER if secret > g else LOWER)
            lo, hi = (g + 1, hi) if secret > g else (lo, g - 1)


class GuessEnv:
    """The higher/lower game on a `GuessTask`: `max_guesses` turns.

    `consistent_reward` (default 0: the outcome reward only) is a per-turn reward: + for a wrong guess
    inside the range still possible after the answers so far, - for one outside it (a wasted turn)."""

    stop_strings: tuple[str, ...] = (END,)

    def __init__(self, source: TaskSource, max_guesses: int = 8, consistent_reward: float = 0.0) -> None:
        if max_guesses < 1:
            raise ValueError(f"GuessEnv.max_guesses must be >= 1, got {max_guesses!r}")
        self.source, self.max_guesses, self.consistent_reward = source, max_guesses, consistent_reward
        self.high = int(getattr(source, "high", 10**6))
        self.secret, self.turns, self.lo, self.hi = 0, 0, 0, self.high

    async def reset(self, task: Task, seed: int) -> Observation:
        self.secret, self.turns, self.lo, self.hi = int(task.answer), 0, 0, self.high
        return Observation(task.prompt, "template")

    async def step(self, action: str) -> StepResult:
        self.turns += 1
        found = guesses(action)
        guess = found[-1] if found else None
        if guess == self.secret:
            return StepResult(None, 1.0, done=True, info={"guesses": self.turns})
        if self.turns >= self.max_guesses:
            return StepResult(None, 0.0, done=True, truncated=True, info={"guesses": self.turns})
        if guess is None:  # not a number: the game says so and the turn is spent
            return StepResult(Observation("?", "env"), -self.consistent_reward or None, done=False)
        inside = self.lo <= guess <= self.hi
        if self.secret > guess:
            self.lo = max(self.lo, guess + 1)
        else:
            self.hi = min(self.hi, guess - 1)
        reward = (self.consistent_reward if inside else -self.consistent_reward) or None
        return StepResult(Observation(HIGHER if self.secret > guess else LOWER, "env"), reward, done=False)

    async def close(self) -> None:
        return None
