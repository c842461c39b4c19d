"""Memory-aware admission (Past-Future): admit only while the batch's predicted peak KV memory fits.

Each running request holds c_j = prompt + output-so-far tokens of keys/values and is
predicted to run r_j more tokens. Memory grows by one token per running request per step
and drops when a request ends, so the peak falls at a finish time:
    peak = max_i  sum_{j : r_j >= r_i} (c_j + r_i)
A waiting request (c = its prompt and prefix, r = its predicted output) is admitted, in
arrival order, only if the peak with it still fits `kv_budget_tokens`.

The prediction comes from the past: the final length of a request that has generated g
tokens is the `quantile` of the recent realised output lengths above g, capped by its
`max_new_tokens`; with no such history it is `max_new_tokens`, the safe bound. With
quantile 1.0 and a history that covers the lengths to come, predictions bound the real
lengths and the real KV use never exceeds the budget; a lower quantile admits more and
may overshoot (the paper's engine then evicts; this policy does not preempt). A request
that does not fit even into an empty batch is admitted alone, so the queue cannot stall.
The budget is in tokens, as in a paged KV cache; the built-in engine preallocates slots,
so here the budget caps the modelled paged memory, not the engine's allocation.

References: LightLLM Past-Future scheduler (Gong et al., 2025, "Past-Future Scheduler for
LLM Serving under SLA Guarantees").
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from schedrl.engine.admission import take_in_order
from schedrl.registry import check_arg
from schedrl.rollout.observe import Listener, RunningState
from schedrl.types import Request, Sample


def peak_kv_tokens(held: Sequence[int], remaining: Sequence[int]) -> int:
    """Predicted peak of sum(held + generated) as requests run `remaining` more tokens each."""
    pairs = sorted(zip(remaining, held, strict=True))
    peak, tail = 0, sum(held)  # tail: held tokens of requests that finish at or after r_i
    for k, (r, c) in enumerate(pairs):
        peak = max(peak, tail + (len(pairs) - k) * r)
        tail -= c
    return peak


class LengthHistory(Listener):
    """Recent realised output lengths, kept sorted for quantile queries."""

    def __init__(self, window: int = 2048, quantile: float = 0.99) -> None:
        self.quantile = quantile
        self._fifo: deque[int] = deque()
        self._sorted: list[int] = []
        self.window = window

    def add(self, length: int) -> None:
        self._fifo.append(length)
        bisect.insort(self._sorted, length)
        if len(self._fifo) > self.window:
            self._sorted.pop(bisect.bisect_left(self._sorted, self._fifo.popleft()))

    def on_finish(self, sample: Sample) -> None:
        if sample.finish_reason in ("stop", "length"):
            self.add(sample.num_tokens)

    def final_length(self, generated: int, max_new_tokens: int) -> int:
        """Predicted final output length of a request with `generated` tokens so far."""
        lo = bisect.bisect_right(self._sorted, generated)
        above = len(self._sorted) - lo
        if above == 0:
            return max_new_tokens
        k = lo + min(above - 1, int(self.quantile * above))
        return max(generated + 1, min(self._sorted[k], max_new_tokens))


class PastFutureAdmission:
    """FCFS, gated by the predicted peak KV memory of the running batch."""

    @dataclass(frozen=True)
    class Args:
        kv_budget_tokens: int  # the modelled paged KV memory, in tokens (required)
        quantile: float = 0.99  # of the recent lengths above a request's progress: its predicted length
        window: int = 2048  # recent realised output lengths the quantile is taken over

        def __post_init__(self) -> None:
            check_arg(self.kv_budget_tokens > 0, "kv_budget_tokens", self.kv_budget_tokens, "> 0")
            check_arg(0 < self.quantile <= 1, "quantile", self.quantile, "in (0, 1]")
            check_arg(self.window > 0, "window", self.window, "> 0")

    def __init__(self, args: Args) -> None:
        self.budget = args.kv_budget_tokens
        self.history = LengthHistory(args.window, args.quantile)
        self.state = RunningState([self.history])
        self.peak_seen = 0  # largest real KV use observed at an admission round

    def bind(self, engine) -> None:
        self.state.bind(engine)

    def _remaining(self, request: Request, generated: int) -> int:
        return self.history.final_length(generated, request.params.max_new_tokens) - generated

    def select(
        self, waiting: Sequence[Request], *, free_slots: int, token_budget: int, num_running: int
    ) -> list[int]:
        self.state.sync()
        self.peak_seen = max(self.peak_seen, self.state.kv_tokens)
        held = [r.kv_tokens for r in self.state.running.values()]
        remaining = [self._remaining(r.request, r.generated) for r in self.state.running.values()]
        chosen = []
        for i in take_in_order(range(len(waiting)), waiting, free_slots, token_budget):
            req = waiting[i]
            c, r = req.num_prefill_tokens, self._remaining(req, len(req.prefix_ids))
            if held and peak_kv_tokens([*held, c], [*remaining, r]) > self.budget:
                break
            held.append(c)
            remaining.append(r)
            chosen.append(i)
            self.state.admit(req)
        return chosen
