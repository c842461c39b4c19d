"""Score samples with a task's reward function; a reward that raises scores 0 and is counted."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from schedrl.envs.base import Task, TaskSource
from schedrl.types import Sample, task_of

log = logging.getLogger(__name__)


class RewardError(RuntimeError):
    """The reward function raised on more samples than the run allows, or a reward reached a bound of its
    own (a judge's parse failures): not scored 0 like other errors, but the run's end."""


def needs_reward(s: Sample) -> bool:
    """A finished sample nobody has scored yet (an episode comes scored by its environment)."""
    return s.finish_reason != "aborted" and s.reward is None


def resolves(task: Task, wave: int) -> int:
    """The batch whose draw resolves the outcome of `task`, drawn in batch `wave` (-1: known at once): its
    `metadata["resolves_in"]` batches later (forecasting, `schedrl.envs.forecast`)."""
    delay = task.metadata.get("resolves_in")
    return -1 if delay is None else wave + int(delay)


def reward_delay(source: object) -> int:
    """The most batches a task of `source` waits for its outcome (its `reward_delay`; 0: none)."""
    return int(getattr(source, "reward_delay", 0) or 0)


class RewardScorer:
    """Calls `source.reward` per sample; stops the run when the error rate exceeds `max_error_rate`.

    A task whose reward waits on something outside the process (a sandbox, a server) declares
    `reward_workers = n`: its rewards then run on n threads at once, in sample order. A task with
    `reward_batch(tasks, completions, completion_ids) -> (rewards, metrics, errors)` (batch reward
    functions, as TRL's) is scored in one call: a sample with an error scores 0 and is counted, and if
    the call raises, every sample of it does.
    `take_metrics()` gives the batch metrics' means since the last call.

    Scoring and counting are two steps, so scoring can run where the reward is placed
    (`pipeline.reward_placement`: an engine worker or a reward worker) and counting where the run is
    watched: `score` returns the samples with their reward, error and the call's metrics on them;
    `account` counts them (and stops the run above the error rate). Calling the scorer does both."""

    def __init__(self, source: TaskSource, max_error_rate: float = 0.05, min_samples: int = 50) -> None:
        self.source, self.max_error_rate, self.min_samples = source, max_error_rate, min_samples
        self.errors = 0
        self.total = 0
        self.last_error: str | None = None
        self._metrics: dict[str, list[float]] = {}  # key -> [weighted sum, weight]

    def take_metrics(self) -> dict[str, float]:
        out = {k: total / n for k, (total, n) in self._metrics.items() if n}
        self._metrics = {}
        return out

    def __call__(self, tasks: Mapping[str, Task], samples: Sequence[Sample]) -> list[float]:
        scored = self.score(tasks, samples)
        self.account(scored)
        return [float(s.reward or 0.0) for s in scored]

    def score(self, tasks: Mapping[str, Task], samples: Sequence[Sample]) -> list[Sample]:
        """`samples` with their rewards (0 where the reward raised), errors and this call's metrics."""
        workers = int(getattr(self.source, "reward_workers", 1) or 1)
        metrics: dict[str, float] = {}
        batch = getattr(self.source, "reward_batch", None)
        if batch is not None and samples:
            outcomes, metrics = self._score_batch(batch, [tasks[task_of(s)] for s in samples], samples)
        elif workers > 1 and len(samples) > 1:
            with ThreadPoolExecutor(min(workers, len(samples))) as pool:
                outcomes = list(pool.map(lambda s: self._score(tasks[task_of(s)], s.text), samples))
        else:
            outcomes = [self._score(tasks[task_of(s)], s.text) for s in samples]
        report = tuple(metrics.items())
        return [
            replace(s, reward=r, reward_error=e, reward_metrics=report)
            for s, (r, e) in zip(samples, outcomes, strict=True)
        ]

    def score_where(self, tasks: Mapping[str, Task], samples: Sequence[Sample]) -> list[Sample]:
        """`samples` in order, those that need a reward and whose task is in `tasks` scored (`score`), the
        others as they came."""
        todo = [s for s in samples if needs_reward(s) and task_of(s) in tasks]
        scored = {s.request_id: s for s in self.score(tasks, todo)} if todo else {}
        return [scored.get(s.request_id, s) for s in samples]

    def account(self, scored: Sequence[Sample]) -> None:
        """Count samples `score` returned (wherever it ran): errors, the batch metrics, the error rate."""
        for s in scored:  # counted here, on one thread
            self.total += 1
            if s.reward_error is not None:
                self.errors += 1
                self.last_error = s.reward_error
                log.warning("reward raised, scored 0: %s", s.reward_error)
            for k, v in s.reward_metrics or ():
                acc = self._metrics.setdefault(k, [0.0, 0.0])
                acc[0] += v
                acc[1] += 1
        rate = self.errors / max(1, self.total)
        if self.total >= self.min_samples and rate > self.max_error_rate:
            raise RewardError(
                f"the reward function raised on {self.errors} of {self.total} samples ({rate:.1%}), above "
                f"max_reward_error_rate={self.max_error_rate}; last error: {self.last_error}"
            )

    def _score_batch(
        self, batch, tasks: list[Task], samples: Sequence[Sample]
    ) -> tuple[list[tuple[float, str | None]], dict[str, float]]:
        try:
            rewards, metrics, errors = batch(tasks, [s.text for s in samples], [s.token_ids for s in samples])
        except RewardError:
            raise
        except Exception as err:  # a user's reward function may raise anything: the batch scores 0
            return [(0.0, f"{type(err).__name__}: {err}")] * len(samples), {}
        return [(float(r), e) for r, e in zip(rewards, errors, strict=True)], dict(metrics)

    def _score(self, task: Task, text: str) -> tuple[float, str | None]:
        """(reward, None), or (0.0, what went wrong) when the reward raised or was not finite."""
        try:
            reward = float(self.source.reward(task, text))
            if not math.isfinite(reward):
                raise ValueError(f"reward is not finite: {reward}")
            return reward, None
        except RewardError:
            raise
        except Exception as err:  # a user's reward function may raise anything
            return 0.0, f"task {task.id!r}: {type(err).__name__}: {err}"
