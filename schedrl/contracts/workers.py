"""The contracts of the loop's workers: where they run (`Backend`), the engines as one (`Fleet`), the
learner (`Trainer`), and the typed batch that crosses to it (`LearnerBatch`).

A backend runs workers as Ray actors, threads or in the calling process; every call returns a future
that `get` resolves, so the loop reads the same on all three. The fleet and the trainer are what the
pipeline's loop drives: on the real clock an `EngineFleet` and a learner worker, on the simulator's
virtual clock its engines and the learner's cost model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from schedrl.config import RunConfig
from schedrl.types import Request


@dataclass(frozen=True)
class LearnerBatch:
    """One update's samples as the learner trains on them: plain lists, so the batch crosses a process
    boundary as it is. Row i is sample i of the batch."""

    prompt_ids: list[list[int]]
    token_ids: list[list[int]]
    logprobs: list[list[float]]  # the behaviour policy's, per completion token
    versions: list[list[int]]  # the policy version that produced each completion token
    train_mask: list[list[bool]]  # per completion token: trained on, or context only (stale, a tool's)
    advantages: list[Any]  # per sample (B,), or per token (B, L-1) under per-turn credit
    request_ids: list[str]
    max_staleness: int  # the bound k the batch was taken under

    def __post_init__(self) -> None:
        rows = {len(self.prompt_ids), len(self.token_ids), len(self.logprobs), len(self.versions)}
        rows |= {len(self.train_mask), len(self.advantages), len(self.request_ids)}
        if len(rows) != 1:
            raise ValueError(
                f"LearnerBatch: every field holds one row per sample, got lengths {sorted(rows)}"
            )


class Backend(Protocol):
    """Where workers run. Promises: a call's future resolves to its result or raises its error (a dead
    worker as `WorkerDiedError`, one past `timeout_s` as `WorkerStuckError`); calls to one worker run in
    the order they were made; `wait` returns the futures that are done (at least one, or none after
    `timeout`); `built` the workers whose constructor has finished."""

    name: str
    timeout_s: float | None

    def start_engine(
        self, cfg: RunConfig, weights: Any, version: int, index: int = 0, reward_source: Any = None
    ) -> Any: ...

    def start_reward(self, cfg: RunConfig, source: Any) -> Any: ...

    def start_learner(self, cfg: RunConfig, run_root: str, checkpoint: str | None) -> Any: ...

    def call(self, worker: Any, method: str, *args: Any, num_returns: int = 1) -> Any: ...

    def wait(self, futures: list, timeout: float | None = None) -> list: ...

    def get(self, future: Any, timeout: float | None = None) -> Any: ...

    def put(self, value: Any) -> Any: ...

    def built(self, workers: list, timeout: float | None = None) -> list: ...

    def kill(self, worker: Any) -> None: ...

    def stack(self, worker: Any) -> str: ...

    def shutdown(self, wait: bool = True) -> None: ...


class Fleet(Protocol):
    """The engines, as the loop and the weight-sync policies see them. Promises: `send` hands each request
    to one engine (whole groups together unless the schedule divides them); `cut` aborts everything the
    engines hold, each sample coming back with its prefix; `push` reaches every engine between two decode
    steps, `stage` holds weights back until `flush`; `version` is the policy version the engines hold (or
    will, once pushed), `idle` whether they hold nothing."""

    version: int
    staged: tuple[Any, int] | None

    @property
    def idle(self) -> bool: ...

    def send(self, requests: Sequence[Request], tasks: Mapping[str, Any] | None = None) -> None: ...

    def abort(self, request_ids: Sequence[str]) -> None: ...

    def cut(self) -> None: ...

    def push(self, weights: Any, version: int, skip: int | None = None) -> None: ...

    def stage(self, weights: Any, version: int) -> None: ...

    def flush(self, skip: int | None = None) -> None: ...


class Trainer(Protocol):
    """The learner. Promises: `update(batch, step)` runs one optimizer step that turns policy version
    `step` into `step + 1` and returns (its metrics, the push of the new weights); `weights(version)` the
    current weights as a push of `version` (`engine.weight_push.WeightPush`);
    `save_checkpoint(step, state)` writes a checkpoint that resumes exactly (weights, optimizer, schedule,
    RNG, `state`)."""

    def update(self, batch: LearnerBatch, step: int) -> tuple[dict[str, float], Any]: ...

    def weights(self, version: int) -> Any: ...

    def save_checkpoint(self, step: int, state: dict) -> str: ...
