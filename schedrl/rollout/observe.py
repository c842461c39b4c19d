"""What the engine is doing with each admitted request, fed by its token and finish callbacks.

Admission policies that look at the running batch (length-aware ordering, memory-aware
admission) and online learners (length predictors, the pruning head) subscribe here. A
`RunningState` binds to an engine by chaining the engine's `on_token` / `on_finish`
callbacks, so whatever callbacks the engine already had keep running.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from schedrl.types import Request, Sample


class Listener:
    """Hooks a subscriber may override; all default to doing nothing."""

    def on_admit(self, request: Request) -> None:
        """`request` entered the running batch."""

    def on_token(self, request: Request, generated: int, logprob: float) -> None:
        """`request` now has `generated` output tokens (a resumed prefix counts); the last has `logprob`."""

    def on_finish(self, sample: Sample) -> None:
        """A request left the batch with `sample` (stop, length, or aborted)."""

    def on_drop(self, request: Request) -> None:
        """`request` left the batch without a finish callback (aborted by its caller)."""


@dataclass
class Running:
    request: Request
    generated: int  # output tokens so far, counting a resumed prefix
    logprobs: list[float] = field(default_factory=list)  # behaviour log-probs of the output so far

    @property
    def kv_tokens(self) -> int:
        """Tokens whose keys/values the request holds: prompt plus output so far."""
        return len(self.request.prompt_ids) + self.generated


class RunningState:
    """The running requests of one engine and the listeners that learn from them."""

    def __init__(self, listeners: list[Listener] | None = None, keep_logprobs: bool = False) -> None:
        self.running: dict[str, Running] = {}
        self.listeners = list(listeners or [])
        self.keep_logprobs = keep_logprobs
        self._engine = None

    def bind(self, engine) -> None:
        """Chain onto `engine`'s callbacks; called once by the engine that owns the policy."""
        if self._engine is not None and self._engine is not engine:
            raise ValueError("this admission policy is already bound to another engine")
        self._engine = engine
        prev_token: Callable | None = engine.on_token
        prev_finish: Callable | None = engine.on_finish

        def on_token(rid: str, tok: int, lp: float, version: int) -> None:
            self.token(rid, lp)
            if prev_token is not None:
                prev_token(rid, tok, lp, version)

        def on_finish(sample: Sample) -> None:
            self.finish(sample)
            if prev_finish is not None:
                prev_finish(sample)

        engine.on_token, engine.on_finish = on_token, on_finish

    def sync(self) -> None:
        """Forget requests the engine no longer runs (aborted ones fire no finish callback)."""
        if self._engine is None or len(self.running) <= self._engine.num_running:
            return
        live = set(self._engine.running_ids)
        for rid in [r for r in self.running if r not in live]:
            request = self.running.pop(rid).request
            for listener in self.listeners:
                listener.on_drop(request)

    def admit(self, request: Request) -> None:
        lps = list(request.prefix_logprobs) if self.keep_logprobs else []
        self.running[request.id] = Running(request, len(request.prefix_ids), lps)
        for listener in self.listeners:
            listener.on_admit(request)

    def token(self, rid: str, logprob: float) -> None:
        run = self.running.get(rid)
        if run is None:
            return
        run.generated += 1
        if self.keep_logprobs:
            run.logprobs.append(logprob)
        for listener in self.listeners:
            listener.on_token(run.request, run.generated, logprob)

    def finish(self, sample: Sample) -> None:
        self.running.pop(sample.request_id, None)
        for listener in self.listeners:
            listener.on_finish(sample)

    @property
    def kv_tokens(self) -> int:
        return sum(r.kv_tokens for r in self.running.values())
