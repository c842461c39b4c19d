"""schedrl's decisions inside vLLM's V1 scheduler, through `EngineArgs(scheduler_cls=...)`.

`SchedRLScheduler` is vLLM's own `Scheduler` with three of its parts steered by a `Steering` (the
`VLLMEngine` adapter), each step before vLLM schedules:

- **Admission.** vLLM's waiting queue is a `PlannedQueue`: it holds every waiting request (arrival
  order, suspended ones in front) but offers vLLM's scheduling loop only the requests schedrl's
  admission policy chose this step, in its order. vLLM then admits them as it admits any request:
  prefix-cache lookup, block allocation, chunked prefill and the token budget are its own.
- **Preemption.** A preemptive admission policy's `victims` are taken off vLLM's running list and
  passed to vLLM's `_preempt_request`: their blocks go back to the pool (full blocks stay in the
  prefix cache) and they wait at the front of the queue, to resume with their outputs recomputed,
  mostly from cached blocks. vLLM's own preemptions under memory pressure are reported the same way.
- **Pinning** (the `pin` tool-wait policy). A finished request whose `keep_kv_s` is positive keeps its
  full blocks: the scheduler takes a reference on them (`BlockPool.touch`) before vLLM frees the
  request, so they cannot be evicted and its continuation's prefix-cache lookup finds them. The
  reference is dropped when the continuation is admitted (it holds its own then), when the time to
  live runs out before the continuation arrives, on `release`, or when the blocks are needed: before
  a step, pins are given up (the one expiring first first; one whose continuation waits, last) until
  the blocks free cover the offered requests' prompts and the running requests' next tokens. The
  parking room is thus the KV cache itself, counted in blocks of keys and values, not in slots.

- **Probes.** Requests whose id starts with `PROBE` (`VLLMEngine.probe_logprobs`, the check that
  follows a weight push) are schedrl's own: they go first, in places of their own beside the policy's
  `max_running`, and nothing of them reaches the admission policy.

The hooks are vLLM internals (`self.waiting`, `_preempt_request`, `_free_request_blocks`, the block
pool), which vLLM warns are not a public interface: `vllm_engine.SUPPORTED_VLLM` names the versions
they were read from, and the adapter refuses others.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from vllm.v1.core.sched.request_queue import RequestQueue  # pyright: ignore[reportMissingImports]
from vllm.v1.core.sched.scheduler import Scheduler  # pyright: ignore[reportMissingImports]
from vllm.v1.metrics.stats import PrefixCacheStats  # pyright: ignore[reportMissingImports]
from vllm.v1.request import Request as VRequest  # pyright: ignore[reportMissingImports]
from vllm.v1.request import RequestStatus  # pyright: ignore[reportMissingImports]

from schedrl.engine.admission import AdmissionPolicy
from schedrl.engine.base import StepStats
from schedrl.engine.preemption import Running
from schedrl.types import Request

PROBE = "schedrl-probe:"  # the id prefix of a weight push's probe requests
PROBE_PLACES = 2  # running places kept for probes beside the policy's (`weight_push.PROBE_SEQS`)


def is_probe(request_id: str) -> bool:
    return request_id.startswith(PROBE)


class Steering(Protocol):
    """What the scheduler asks the adapter: the policy, schedrl's view of each request, and where to
    report what vLLM did."""

    admission: AdmissionPolicy
    max_running: int  # the running places the policy fills (engine.max_concurrency; probes have their own)
    max_batched_tokens: int  # the prefill budget the admission policy is given (engine.max_batched_tokens)

    def now(self) -> float: ...

    def request(self, request_id: str) -> Request:
        """schedrl's request behind a vLLM one, with what it has generated as its prefix."""
        ...

    def running(self, request_id: str) -> Running: ...

    def keep_s(self, request_id: str) -> float:
        """Seconds a finished request's blocks stay pinned for its continuation (0: not pinned)."""
        ...

    def pinned_parent(self, request_id: str) -> str | None:
        """The vLLM id of the pinned request this one continues (it claimed the pin), else None."""
        ...

    def admitted(self, request_id: str, cached_tokens: int) -> None: ...

    def preempted(self, request_id: str, tokens: int) -> None: ...


class PlannedQueue(RequestQueue):
    """vLLM's waiting queue in schedrl's order: it holds every waiting request, and offers vLLM's
    scheduling loop (`peek_request`, `pop_request`, truth) only those chosen by `offer`."""

    def __init__(self) -> None:
        self._all: list[VRequest] = []
        self._offered: list[VRequest] = []

    @property
    def offered(self) -> list[VRequest]:
        """The requests offered this step, in order (those not yet taken)."""
        return list(self._offered)

    def offer(self, indices: Iterable[int]) -> None:
        """Offer these requests (indices into the queue's order) this step, in this order."""
        self._offered = [self._all[i] for i in indices]

    def add_request(self, request: VRequest) -> None:
        self._all.append(request)

    def pop_request(self) -> VRequest:
        request = self._offered.pop(0)
        self._all.remove(request)
        return request

    def peek_request(self) -> VRequest:
        if not self._offered:
            raise IndexError("peek from a queue that offers nothing this step")
        return self._offered[0]

    def prepend_request(self, request: VRequest) -> None:
        self._all.insert(0, request)

    def prepend_requests(self, requests: Iterable[VRequest]) -> None:
        self._all[:0] = list(requests)

    def remove_request(self, request: VRequest) -> None:
        self.remove_requests([request])

    def remove_requests(self, requests: Iterable[VRequest]) -> None:
        gone = {id(r) for r in requests}
        self._all = [r for r in self._all if id(r) not in gone]
        self._offered = [r for r in self._offered if id(r) not in gone]

    def __bool__(self) -> bool:
        return bool(self._offered)

    def __len__(self) -> int:
        return len(self._all)

    def __iter__(self) -> Iterator[VRequest]:
        return iter(list(self._all))


@dataclass
class PinnedBlocks:
    """A finished request's blocks, referenced for its continuation."""

    blocks: list[Any]  # vLLM KVCacheBlocks (full ones: only those the prefix cache can serve)
    expires: float  # inf once the continuation has arrived
    tokens: int  # tokens the blocks hold


class SchedRLScheduler(Scheduler):
    """vLLM's scheduler, with schedrl's admission order, preemptions and pinned blocks (module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.waiting = PlannedQueue()
        self.steer: Steering | None = None
        self.pins: dict[str, PinnedBlocks] = {}
        self.last_step = StepStats()
        self.num_pins_claimed = 0  # continuations that found their pin
        self.num_pins_expired = 0
        self.num_pins_evicted = 0
        # vLLM's own prefix-cache counters (queries, hits), kept whether or not vLLM logs stats
        self.kv_cache_manager.log_stats = True
        self.kv_cache_manager.prefix_cache_stats = PrefixCacheStats()

    # ---- each step ---------------------------------------------------------------------------
    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        steer = self.steer
        if steer is None:  # not steered: first come, first served
            self.waiting.offer(range(len(self.waiting)))
            return super().schedule(*args, **kwargs)
        now = steer.now()
        for rid in [r for r, pin in self.pins.items() if pin.expires <= now]:
            self.release(rid)
            self.num_pins_expired += 1
        self._preempt_for_waiting(steer)
        self._offer(steer)
        self._make_room()
        offered = self.waiting.offered  # only an offered request can be admitted, in this order
        out = super().schedule(*args, **kwargs)
        for r in offered:
            if r.status == RequestStatus.RUNNING and not is_probe(r.request_id):  # admitted this step
                scheduled = out.num_scheduled_tokens.get(r.request_id, 0)
                parent = steer.pinned_parent(r.request_id)
                steer.admitted(r.request_id, r.num_computed_tokens - scheduled)
                if parent is not None:  # it holds the pinned blocks itself now
                    self.release(parent)
        self._account(out)
        return out

    def _preempt_for_waiting(self, steer: Steering) -> None:
        victims = getattr(steer.admission, "victims", None)
        if victims is None or not len(self.waiting) or not self.running:
            return
        waiting = [steer.request(r.request_id) for r in self.waiting if not is_probe(r.request_id)]
        ours = [r for r in self.running if not is_probe(r.request_id)]
        running = [steer.running(r.request_id) for r in ours]
        free = max(steer.max_running - len(ours), 0)
        by_id = {view.request.id: r for view, r in zip(running, ours, strict=True)}
        for rid in victims(running, waiting, free):
            self.preempt(by_id[rid])

    def preempt(self, request: VRequest) -> None:
        """Take a running request off the batch through vLLM's own preemption (it waits in front)."""
        self.running.remove(request)
        self._preempt_request(request, time.monotonic())

    def _offer(self, steer: Steering) -> None:
        waiting = list(self.waiting)
        probes = [i for i, r in enumerate(waiting) if is_probe(r.request_id)]  # first, in their own places
        free = steer.max_running - sum(not is_probe(r.request_id) for r in self.running)
        if free <= 0 or len(probes) == len(waiting):
            self.waiting.offer(probes)
            return
        parents = [steer.pinned_parent(r.request_id) for r in waiting]
        # a continuation whose history is pinned goes first: the blocks are already its own, and it
        # prefills only what they do not hold
        first = [i for i, parent in enumerate(parents) if parent is not None][:free]
        new_tokens = sum(waiting[i].num_tokens - self._pinned_tokens(parents[i]) for i in first)
        rest = [i for i in range(len(waiting)) if i not in set(first) and i not in set(probes)]
        chosen: list[int] = []
        if rest and free > len(first):
            picked = steer.admission.select(
                [steer.request(waiting[i].request_id) for i in rest],
                free_slots=free - len(first),
                token_budget=max(steer.max_batched_tokens - len(self.running) - new_tokens, 0),
                num_running=len(self.running),
            )
            chosen = [rest[j] for j in picked]
        if not first and not chosen and not self.running and rest:  # nothing runs: the head goes alone
            chosen = [rest[0]]
        self.waiting.offer([*probes, *[*first, *chosen][:free]])

    def _pinned_tokens(self, parent: str | None) -> int:
        pin = self.pins.get(parent) if parent is not None else None
        return pin.tokens if pin is not None else 0

    def _make_room(self) -> None:
        """Give pins up until the free blocks cover the offered prompts and the running rows' next tokens."""
        if not self.pins:
            return
        pool = self.kv_cache_manager.block_pool
        need = len(self.running) + sum(
            math.ceil(r.num_tokens / self.block_size) for r in self.waiting.offered
        )
        while self.pins and pool.get_num_free_blocks() < need:
            self.release(min(self.pins, key=lambda r: self.pins[r].expires))
            self.num_pins_evicted += 1

    def _account(self, out: Any) -> None:
        decode = prefill = context = 0
        for rid, n in out.num_scheduled_tokens.items():
            request = self.requests.get(rid)
            if n == 1:
                decode += 1
            else:
                prefill += n
            if request is not None:
                context += request.num_computed_tokens
        self.last_step = StepStats(decode_rows=decode, prefill_tokens=prefill, context_tokens=context)

    # ---- vLLM's hooks ------------------------------------------------------------------------
    def _preempt_request(self, request: VRequest, timestamp: float, drop_stale_output: bool = False) -> None:
        tokens = request.num_computed_tokens
        super()._preempt_request(request, timestamp, drop_stale_output)
        if self.steer is not None:
            self.steer.preempted(request.request_id, tokens)

    def _free_request_blocks(self, request: VRequest) -> None:
        steer = self.steer
        if steer is not None and request.is_finished() and request.status != RequestStatus.FINISHED_ABORTED:
            keep = steer.keep_s(request.request_id)
            if keep > 0:
                self._pin(request, steer.now() + keep)
        super()._free_request_blocks(request)

    # ---- pins --------------------------------------------------------------------------------
    def _pin(self, request: VRequest, expires: float) -> None:
        groups = self.kv_cache_manager.get_blocks(request.request_id).blocks
        blocks = [b for g in groups for b in g if not b.is_null and b.block_hash is not None]
        self.kv_cache_manager.block_pool.touch(blocks)
        self.pins[request.request_id] = PinnedBlocks(
            blocks, expires, len(blocks) * self.block_size // len(groups)
        )

    def claim(self, request_id: str, now: float) -> bool:
        """The pinned request's continuation has arrived: hold its blocks until it is admitted (False,
        and released, when its time ran out first)."""
        pin = self.pins.get(request_id)
        if pin is None:
            return False
        if pin.expires <= now:
            self.release(request_id)
            self.num_pins_expired += 1
            return False
        pin.expires = math.inf
        self.num_pins_claimed += 1
        return True

    def release(self, request_id: str) -> bool:
        """Drop the pin's reference: its blocks become evictable (they stay cached until reused)."""
        pin = self.pins.pop(request_id, None)
        if pin is None:
            return False
        self.kv_cache_manager.block_pool.free_blocks(reversed(pin.blocks))
        return True

    @property
    def prefix_cache(self) -> dict[str, int]:
        """vLLM's prefix-cache counters since the engine started, in tokens: queried and hit by new
        requests, and by preempted ones coming back."""
        st = self.kv_cache_manager.prefix_cache_stats
        return {
            "queries": st.queries,
            "hits": st.hits,
            "preempted_queries": st.preempted_queries,
            "preempted_hits": st.preempted_hits,
        }
