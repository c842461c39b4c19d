"""The task contract shared by every verifiable environment.

A ``TaskSource`` hands out ``Task`` records for a split and scores completions with a
verifier. Train and eval never overlap: membership is a stable hash of the problem's
canonical key (the prompt for generated tasks, the id for file tasks), so a problem
lands in the same split in every process, run and Python version.
"""

from __future__ import annotations

import hashlib
import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

SPLITS = ("train", "eval")
_BUCKETS = 1_000_000


@dataclass(frozen=True)
class Task:
    """One verifiable problem."""

    id: str
    """Stable identifier (e.g. ``"add-<hash of prompt>"``); the same problem always gets the same id."""
    prompt: str
    """Text given to the model; built-in prompts end with ``"="``."""
    answer: str
    """Reference answer text (may be ``""`` when only the verifier knows what is right)."""
    domain: str
    """Sub-task name, so schedulers can group tasks (e.g. ``"addition"``, ``"sort_long"``)."""
    difficulty: float | None = None
    """Optional difficulty estimate; ``None`` when unknown."""
    metadata: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    """Free-form extra fields (e.g. the other columns of a user's dataset row)."""
    messages: tuple[dict[str, Any], ...] | None = field(default=None, hash=False, compare=False)
    """A chat prompt (role/content messages), rendered by the tokenizer's chat template; ``prompt`` then
    holds a readable copy, and `schedrl.envs.chat.prompt_ids` gives the tokens the model sees."""


@runtime_checkable
class TaskSource(Protocol):
    """Where tasks come from and how completions are scored."""

    name: str

    def sample(self, split: str, n: int, seed: int) -> list[Task]:
        """Return ``n`` tasks from ``split`` ("train" or "eval"); the same seed gives the same tasks."""
        ...

    def reward(self, task: Task, completion: str) -> float:
        """Score the decoded text after the prompt: 1.0 right, 0.0 wrong (surrounding whitespace ignored)."""
        ...

    def solution(self, task: Task) -> str:
        """A completion that earns reward 1.0 (for supervised warm-up and length statistics)."""
        ...


def check_split(split: str) -> str:
    """Return ``split`` if it is "train" or "eval", else raise ``ValueError`` naming the bad value."""
    if split not in SPLITS:
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    return split


def check_count(n: int) -> int:
    """Return ``n`` if it is a non-negative int, else raise ``ValueError``."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    return n


def stable_hash(key: str) -> int:
    """A 64-bit hash of ``key`` that is the same in every process (unlike the built-in ``hash``)."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big")


def split_of(key: str, eval_fraction: float = 0.1) -> str:
    """Return "eval" for about ``eval_fraction`` of keys and "train" for the rest, deterministically."""
    return "eval" if stable_hash(key) % _BUCKETS < round(eval_fraction * _BUCKETS) else "train"


def task_id(prefix: str, key: str) -> str:
    """A short stable id such as ``"add-3f2a9c1b0d4e"`` derived from the problem's key."""
    return f"{prefix}-{hashlib.sha256(key.encode('utf-8')).hexdigest()[:12]}"


def check_int_range(task: str, name: str, value: object, lo: int, hi: int | None = None) -> int:
    """Return ``value`` if it is an int in ``[lo, hi]``; else ``ValueError`` naming task and argument."""
    if not isinstance(value, int) or isinstance(value, bool) or value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"task '{task}': {name} must be an int {bound}, got {value!r}")
    return value


def check_order(task: str, lo_name: str, lo: int, hi_name: str, hi: int) -> None:
    """Raise ``ValueError`` unless ``lo <= hi``."""
    if lo > hi:
        raise ValueError(f"task '{task}': {lo_name} ({lo}) must be <= {hi_name} ({hi})")


class GeneratedTasks(ABC):
    """Base for procedurally generated tasks: subclasses define ``candidate`` and ``reward``.

    ``sample`` draws candidates from ``random.Random(seed)`` and rejects those whose prompt
    hashes to the other split (about 10% of problems are eval).
    """

    name: str = "generated"
    max_tries: int = 10_000
    """Candidates tried per task before giving up (only hit when the problem space is tiny)."""

    @abstractmethod
    def candidate(self, rng: random.Random) -> Task | None:
        """Build one random problem, or ``None`` to reject it (e.g. a non-integer target)."""

    @abstractmethod
    def reward(self, task: Task, completion: str) -> float:
        """Score a completion of ``task``."""

    def solution(self, task: Task) -> str:
        return task.answer

    def split_key(self, task: Task) -> str:
        """What decides a task's split: its prompt (a task whose prompts repeat across problems, such as a
        few sizes or letters, splits on what follows them instead)."""
        return task.prompt

    def draw(self, rng: random.Random, split: str) -> Task:
        """Draw one task from ``split`` using ``rng`` (rejection sampling on the split hash)."""
        for _ in range(self.max_tries):
            task = self.candidate(rng)
            if task is not None and split_of(self.split_key(task)) == split:
                return task
        raise ValueError(
            f"task '{self.name}': no {split!r} problem found in {self.max_tries} tries; "
            "the problem space is too small, widen the length or digit range"
        )

    def sample(self, split: str, n: int, seed: int) -> list[Task]:
        check_split(split)
        rng = random.Random(seed)
        return [self.draw(rng, split) for _ in range(check_count(n))]


def exact_match(task: Task, completion: str) -> float:
    """1.0 if the stripped completion equals the stripped reference answer, else 0.0."""
    return float(completion.strip() == task.answer.strip())


RewardFn = Callable[[Task, str], float]
