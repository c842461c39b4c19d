"""The staleness bound k: how many policy versions older than the learner a trained-on token may be.

Versions count optimizer steps: the learner's weights are version v after v updates,
and update s (0-based) trains on a batch and turns version s into s + 1. A token
produced by version u has staleness s - u when update s trains on it. The bound is
enforced twice:

* at admission: a new group may start only if the update expected to consume it,
  ``started + groups_ahead // groups_per_step``, is at most ``engine_version + k``;
  every token it gets is then produced by a version >= engine_version;
* at consumption: every token in a batch for update s must satisfy s - u <= k. Tokens
  that break it (partial rollouts carried over, over-provisioned groups that waited)
  are dropped or corrected, as configured -- never used silently.

k = 0 is synchronous on-policy training. ``AutoStaleness`` moves k within
[k_min, k_max] from the measured mismatch between behaviour and learner log-probs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from schedrl.registry import check_arg


def expected_update(started: int, groups_ahead: int, groups_per_step: int) -> int:
    """Index of the update that will consume a group admitted now, behind `groups_ahead` others."""
    return started + groups_ahead // groups_per_step


def may_admit(started: int, groups_ahead: int, groups_per_step: int, engine_version: int, k: int) -> bool:
    """Admission rule: the group's consuming update is at most k versions past the engine's weights."""
    return expected_update(started, groups_ahead, groups_per_step) <= engine_version + k


def token_staleness(update: int, versions: Sequence[int]) -> list[int]:
    """Staleness of each token when `update` trains on it."""
    return [update - u for u in versions]


@dataclass
class StalenessBound:
    """A fixed bound k with a histogram of the staleness of every consumed token."""

    k: int = 0
    histogram: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        if self.k < 0:
            raise ValueError(f"max_staleness must be >= 0, got {self.k}")

    def fresh_mask(self, update: int, versions: Sequence[int]) -> list[bool]:
        """Per token: may `update` train on it?"""
        return [s <= self.k for s in token_staleness(update, versions)]

    def trainable(
        self, update: int, versions: Sequence[int], stale: str = "drop", trained: Sequence[bool] | None = None
    ) -> list[bool] | None:
        """Per-token trained mask of a sample at `update`, or None when the sample must be dropped:
        with `stale` "drop" every model token must be fresh, with "mask" stale ones stay as context only,
        with "keep" every token trains whatever its age (k bounds admission only: APRIL's partial rollouts
        resume a sample across updates and train it whole, off-policy by the versions it spans).
        `trained` marks the model's tokens (None: all are); the others (a tool's, the environment's) are
        context whatever their version."""
        if trained is None and (not versions or min(versions) >= update - self.k):
            return [True] * len(versions)  # every token is the model's and fresh
        fresh = self.fresh_mask(update, versions)
        model = list(trained) if trained is not None else [True] * len(fresh)
        if stale == "keep":
            return model
        judged = [f for f, m in zip(fresh, model, strict=True) if m]
        if all(judged) or (stale == "mask" and any(judged)):
            return [f and m for f, m in zip(fresh, model, strict=True)]
        return None

    def record(
        self, update: int, versions: Sequence[Sequence[int]], trained: Sequence[Sequence[bool]]
    ) -> Counter:
        """Count the staleness of the trained tokens of a batch (per sample: its tokens' versions and
        trained mask) in the run's histogram; returns the batch's counts."""
        counts = Counter(
            update - v
            for vs, ts in zip(versions, trained, strict=True)
            for v, t in zip(vs, ts, strict=True)
            if t
        )
        self.histogram.update(counts)
        return counts

    def observe(self, mismatch: float) -> int:
        """A fixed bound ignores the measured mismatch; returns k."""
        return self.k

    def state_dict(self) -> dict:
        return {"k": self.k, "histogram": {str(s): n for s, n in self.histogram.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.k = int(state["k"])
        self.histogram = Counter({int(s): n for s, n in state["histogram"].items()})


@dataclass
class AutoStaleness(StalenessBound):
    """``max_staleness: auto``: k follows the measured behaviour-vs-learner mismatch.

    Rule (checked after every update, on the tokens it consumed): keep an exponential
    moving average m of the mismatch (the k3 KL estimate between the behaviour and
    the learner's pre-update policy, per token). If m > ``high`` the data is too far
    off-policy: k <- max(k - 1, k_min). If m < ``low`` and at least ``patience``
    updates have passed since the last change: k <- min(k + 1, k_max). Between the two
    thresholds k stays. Growing slowly and shrinking at once keeps the pipeline deep
    only while the correction has little to correct.
    """

    k_min: int = 0
    k_max: int = 4
    low: float = 0.002
    high: float = 0.01
    ema: float = 0.5
    patience: int = 2
    mismatch: float | None = None
    since_change: int = 0

    @dataclass(frozen=True)
    class Args:
        """`schedule.staleness_args` of `max_staleness: auto`."""

        k_min: int = 0  # lower bound of k, where it starts
        k_max: int = 4  # upper bound of k
        low: float = 0.002  # grow k while the behaviour-vs-learner KL stays below this
        high: float = 0.01  # shrink k when the KL goes above this
        ema: float = 0.5  # weight of the old average in the mismatch's moving average
        patience: int = 2  # updates between two increases of k

        def __post_init__(self) -> None:
            check_arg(0 <= self.k_min <= self.k_max, "k_min", self.k_min, f"in [0, k_max={self.k_max}]")
            check_arg(0 <= self.low < self.high, "low", self.low, f"in [0, high={self.high})")
            check_arg(0 <= self.ema < 1, "ema", self.ema, "in [0, 1)")
            check_arg(self.patience >= 0, "patience", self.patience, ">= 0")

    @classmethod
    def of(cls, args: AutoStaleness.Args) -> AutoStaleness:
        return cls(k=args.k_min, **vars(args))

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.k_min <= self.k_max:
            raise ValueError(
                f"staleness bounds need 0 <= k_min <= k_max, got k_min={self.k_min}, k_max={self.k_max}"
            )
        if not 0 <= self.low < self.high:
            raise ValueError(f"auto staleness needs 0 <= low < high, got low={self.low}, high={self.high}")
        self.k = min(max(self.k, self.k_min), self.k_max)

    def observe(self, mismatch: float) -> int:
        m = mismatch if self.mismatch is None else self.ema * self.mismatch + (1 - self.ema) * mismatch
        self.mismatch = m
        self.since_change += 1
        if m > self.high and self.k > self.k_min:
            self.k, self.since_change = self.k - 1, 0
        elif m < self.low and self.k < self.k_max and self.since_change >= self.patience:
            self.k, self.since_change = self.k + 1, 0
        return self.k

    def state_dict(self) -> dict:
        return {**super().state_dict(), "mismatch": self.mismatch, "since_change": self.since_change}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.mismatch, self.since_change = state["mismatch"], int(state["since_change"])
