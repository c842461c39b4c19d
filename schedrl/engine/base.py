"""The `Engine` protocol: what schedulers may ask of a generation engine."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from schedrl.types import Request, Sample

TokenCallback = Callable[[str, int, float, int], None]  # (request_id, token_id, logprob, version)
FinishCallback = Callable[[Sample], None]


@dataclass(frozen=True)
class StepStats:
    """The work of one engine step: what a cost model of the step needs."""

    decode_rows: int = 0  # requests that sampled from one new token
    prefill_tokens: int = 0  # tokens computed in multi-token rows (prompts, resumes, extensions)
    context_tokens: int = 0  # keys attended, summed over rows


@runtime_checkable
class Engine(Protocol):
    """A generation engine that schedulers steer one decode step at a time.

    Requests join and leave the running batch between steps; `abort` cuts a
    request and returns what it generated so far; `Request.resume(sample)`
    continues it. `update_weights` may be called between any two steps: running
    sequences keep their cache and their next tokens carry the new version.
    Every sample carries its per-token behaviour log-probs and policy versions.

    `on_token(request_id, token_id, logprob, version)` and `on_finish(sample)` are
    called as tokens are sampled and requests finish; an observer (a length
    predictor, an admission policy) chains onto them.
    """

    version: int  # the policy version of the current weights
    eos_ids: frozenset[int]  # token ids that end a sequence
    on_token: TokenCallback | None
    on_finish: FinishCallback | None

    def add(self, request: Request) -> None:
        """Queue a request; the admission policy decides when it enters the batch."""
        ...

    def step(self) -> list[Sample]:
        """Admit, run one forward over the batch, sample one token per running request.

        Returns the requests that finished in this step.
        """
        ...

    def abort(self, request_id: str) -> Sample:
        """Remove a waiting or running request and return its partial sample (finish reason "aborted")."""
        ...

    def update_weights(
        self, weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], version: int
    ) -> None:
        """Load new weights; tokens sampled from now on are tagged `version`."""
        ...

    def has_unfinished(self) -> bool:
        """Whether any request is waiting or running."""
        ...

    def generate(
        self, requests: Sequence[Request], on_step: Callable[[list[Sample]], None] | None = None
    ) -> list[Sample]:
        """Run `requests` to completion; samples come back in request order."""
        ...

    @property
    def waiting_ids(self) -> list[str]:
        """Ids of the queued requests, in queue order."""
        ...

    @property
    def running_ids(self) -> list[str]:
        """Ids of the requests in the running batch."""
        ...

    @property
    def num_waiting(self) -> int: ...

    @property
    def num_running(self) -> int: ...


@runtime_checkable
class ParkingEngine(Engine, Protocol):
    """An engine that can keep a finished request's keys and values for a continuation.

    A request with `keep_kv_s > 0` parks its slot when it finishes; a request whose `continues`
    names it and whose prompt extends its tokens prefills only the new tokens. `evict` gives a
    parked slot up; the engine also gives it up past its time or when an admission needs it.
    """

    last_step: StepStats  # the work of the last step (for cost models and virtual clocks)

    def evict(self, request_id: str) -> bool: ...

    @property
    def parked_ids(self) -> list[str]: ...

    @property
    def num_cached_tokens(self) -> int: ...


LOG_CAP = 1 << 16  # entries an engine's event log (admissions, preemptions) keeps: the newest


def log_event(log: list, item: object) -> None:
    """Append `item` to an engine's event log, dropping the oldest half past `LOG_CAP` (a long run's engine
    must not hold every request id it ever saw)."""
    log.append(item)
    if len(log) > LOG_CAP:
        del log[: LOG_CAP // 2]


def check_fits(request: Request, max_model_len: int, max_batched_tokens: int) -> None:
    """Refuse a request whose prompt (and resumed prefix) cannot be prefilled, naming the limit it passes."""
    n = request.num_prefill_tokens
    if n >= max_model_len:
        raise ValueError(
            f"request {request.id!r}: prompt of {n} tokens does not fit the model context of "
            f"{max_model_len} tokens (max_model_len)"
        )
    if n > max_batched_tokens:
        raise ValueError(
            f"request {request.id!r}: prompt of {n} tokens exceeds max_batched_tokens={max_batched_tokens}"
        )


class _Steps(Protocol):
    def add(self, request: Request) -> None: ...

    def step(self) -> list[Sample]: ...

    def has_unfinished(self) -> bool: ...


def run_to_completion(
    engine: _Steps, requests: Sequence[Request], on_step: Callable[[list[Sample]], None] | None = None
) -> list[Sample]:
    """`engine.generate` for any engine: add `requests`, step until done, samples in request order."""
    for req in requests:
        engine.add(req)
    done: dict[str, Sample] = {}
    while engine.has_unfinished():
        finished = engine.step()
        done.update((s.request_id, s) for s in finished)
        if on_step is not None:
            on_step(finished)
    return [done[r.id] for r in requests]
