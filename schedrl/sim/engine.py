"""One continuous-batching engine instance, simulated as a fluid between events.

Every running request gains one token per decode step, so the engine keeps one counter, `steps`
(decode steps since it started), and a request admitted at counter c0 with r tokens to go finishes
at counter c0 + r: a heap of finish counters gives the next finish without touching the others. The
time of n steps with b running requests is n x `EngineCost.step_s` at the batch's mean context and
mean longest context over those steps (exact: both terms are linear in context, and the longest
request runs through them all), plus the prefill of the requests admitted before the first of them.
Admission runs at every finish: the engine's admission policy (`schedrl.engine.admission`, the real
one: FCFS, LPT, SPT with a predictor) picks from the waiting requests within `max_batch` and the KV
capacity.

A `Job` stands in for a `schedrl.types.Request` where policies look (its id, prefill tokens, prefix,
group, predicted length), so those policies run here unchanged.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from schedrl.engine.admission import FCFS
from schedrl.sim.costs import EngineCost
from schedrl.timeline import Span


@dataclass(eq=False)
class Job:
    """One sample of a group: `length` output tokens in all, `generated` of them already made."""

    id: str
    group: object  # the `orchestrate.buffer.Group` it belongs to
    sample_index: int
    prompt: int
    length: int
    predicted: float
    generated: int = 0
    v_min: int | None = None  # the oldest and newest policy versions among its tokens
    v_max: int | None = None
    priority: float = 0.0
    turns: int = 1  # model turns; between two, the sample waits on a tool off the engine
    cached: int = 0  # context tokens whose keys and values wait parked in the engine (pin): not prefilled
    engine: int = -1  # the engine it last ran on
    waited_from: float = 0.0  # when its current tool call started

    @property
    def turn_end(self) -> int:
        """Tokens generated when the current turn ends: turn t of n ends at round(t x length / n)."""
        return min(self.length, max(self.generated + 1, round((self.turn + 1) * self.length / self.turns)))

    @property
    def request_id(self) -> str:
        return self.id

    @property
    def versions(self) -> tuple[int, int]:
        """The oldest and newest versions among its tokens: what the staleness bound reads."""
        return (self.v_min or 0, self.v_max or 0)

    trained = None  # every token is the model's

    def rows(self) -> list[Job]:
        """What the learner trains on (the loop's staleness check reads each): the job itself, one sequence."""
        return [self]

    @property
    def group_id(self) -> str:
        return self.group.id  # type: ignore[attr-defined]

    @property
    def num_prefill_tokens(self) -> int:
        return self.prompt + self.generated - self.cached

    @property
    def turn(self) -> int:
        """The model turns it has finished."""
        return self.generated * self.turns // self.length if self.length else 0

    @property
    def prefix_ids(self) -> range:  # only its length is read
        return range(self.generated)


@dataclass
class SimEngine:
    index: int
    cost: EngineCost
    admission: Any = field(default_factory=FCFS)  # an AdmissionPolicy, reading Jobs as Requests
    version: int = 0
    max_batched_tokens: int = 1 << 30  # prefill tokens admitted per step (chunked prefill: the chunk)
    park_slots: int = 0  # cache slots beyond the running batch, for trajectories parked on a tool (pin)

    def __post_init__(self) -> None:
        self.clock = 0.0
        self.steps = 0  # decode steps so far: every running request gains one token per step
        self.waiting: list[Job] = []
        self.running: dict[
            str, tuple[Job, int, int]
        ] = {}  # id -> (job, counter at admission, finish counter)
        self._heap: list[tuple[int, int, str]] = []  # (finish counter, seq, id)
        self._seq = 0
        self._ctx_base = 0  # sum over running of (prompt + generated at admission - counter at admission)
        # a lazy max-heap of (-(prompt + generated at admission - counter at admission), seq, id): its
        # top, where still running, is the longest context less the counter
        self._longest: list[tuple[int, int, str]] = []
        self._prefill = 0  # tokens to prefill in the next step
        self.pause_until = 0.0  # a weight sync holds the engine until then
        self.busy_s = 0.0
        self.held_s = 0.0  # seconds the learner held the devices (colocated)
        self.tokens = 0
        self.spans: list[Span] = []
        self.parked: dict[str, tuple[Job, float]] = {}  # id -> (job, expiry): pinned during a tool wait
        self.evicted = 0  # parked trajectories evicted for room before their time to live ran out
        self.expired = 0  # parked trajectories whose answer came after their time to live
        self.slow_factor = 1.0  # x slower inside slow_windows (cluster.interference: overlap)
        self.slow_windows: list[tuple[float, float]] = []  # (start, end), in order
        self.on_token = None  # admission policies that follow the batch chain onto these (never fired)
        self.on_finish = None
        if hasattr(self.admission, "bind"):
            self.admission.bind(self)  # type: ignore[attr-defined]

    # ---- what admission policies read ------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def running_ids(self) -> list[str]:
        return list(self.running)

    @property
    def held(self) -> int:
        return len(self.running) + len(self.waiting)

    @property
    def ctx(self) -> int:
        return self._ctx_base + len(self.running) * self.steps

    @property
    def longest(self) -> int:
        """Keys the next decode step's longest running request attends (its context and its new token)."""
        while self._longest:
            neg, _, rid = self._longest[0]
            entry = self.running.get(rid)
            if entry is not None and entry[0].prompt + entry[0].generated - entry[1] == -neg:
                return -neg + self.steps + 1
            heapq.heappop(self._longest)
        return 0

    # ---- the fluid ---------------------------------------------------------------------------------
    def _span(self, kind: str, start: float, end: float) -> None:
        last = self.spans[-1] if self.spans else None
        if last is not None and last.kind == kind and abs(start - last.end) < 1e-9:
            last.end = end
        elif end > start:
            self.spans.append(Span(f"engine-{self.index}", kind, start, end))

    def _duration(self, n: int, start: float | None = None) -> float:
        """Seconds that the next `n` steps take from `start` (default: the clock)."""
        b = len(self.running)
        mean_ctx = self.ctx + b * (n - 1) / 2.0
        longest = self.longest + (n - 1) / 2.0 if self.cost.padded_key_s else 0.0
        work = n * self.cost.step_s(b, mean_ctx, longest=longest) + self.cost.prefill_token_s * self._prefill
        if self.slow_factor == 1.0 or not self.slow_windows:
            return work
        return self._stretched(self.clock if start is None else start, work)

    def _stretched(self, t0: float, work: float) -> float:
        """Wall seconds from `t0` for `work` seconds at full speed, `slow_factor` x slower inside the slow
        windows (the learner's updates, on shared cores)."""
        t, left, f = t0, work, self.slow_factor
        for a, b in self.slow_windows:
            if b <= t:
                continue
            if a > t:
                if t + left <= a:
                    break
                left -= a - t
                t = a
            if left * f <= b - t:
                return t + left * f - t0
            left -= (b - t) / f
            t = b
        return t + left - t0

    def _run_steps(self, n: int) -> None:
        dt = self._duration(n)
        self._span("decode", self.clock, self.clock + dt)
        self.clock += dt
        self.busy_s += dt
        self.steps += n
        self.tokens += n * len(self.running)
        self._prefill = 0

    def next_finish(self) -> float | None:
        """When the next running request finishes (None: nothing runs)."""
        self._admit()
        if not self._heap:
            return None
        start = max(self.clock, self.pause_until)
        return start + self._duration(self._heap[0][0] - self.steps, start)

    def advance(self, until: float) -> list[Job]:
        """Run to `until` (or to the next finish, if sooner), ending on a step boundary: the step in progress at
        `until` runs to its end, so the clock may pass `until` by less than a step. Returns the jobs
        that finished."""
        done: list[Job] = []
        while True:
            self._admit()
            if not self._heap:
                self.clock = max(self.clock, until)
                return done
            if self.pause_until > self.clock:
                if self.pause_until >= until:
                    self.clock = until
                    return done
                self.clock = self.pause_until
            n = self._heap[0][0] - self.steps
            if self.clock + self._duration(n) <= until + 1e-12:
                self._run_steps(n)
                done += self._pop_finished()
                return done
            # the next finish lies beyond `until`: run the whole steps that end by then, and the step in
            # progress at `until` (an engine finishes the step it is in; what arrives waits for its end)
            if self.clock >= until - 1e-12:  # already on a boundary at or past `until`
                return done
            lo, hi = 0, n
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self.clock + self._duration(mid) <= until:
                    lo = mid
                else:
                    hi = mid - 1
            if lo:
                self._run_steps(lo)
            if self.clock < until - 1e-12:  # inside a step at `until`: it runs to its end
                self._run_steps(1)
            return done + self._pop_finished()

    def _pop_finished(self) -> list[Job]:
        out = []
        while self._heap and self._heap[0][0] <= self.steps:
            _, _, rid = heapq.heappop(self._heap)
            job, c0, _ = self.running.pop(rid)
            self._ctx_base -= job.prompt + job.generated - c0
            job.generated += self.steps - c0
            out.append(job)
        return out

    def _admit(self) -> None:
        if not self.waiting or len(self.running) >= self.cost.max_batch:
            return
        free = self.cost.max_batch - len(self.running)
        if self.cost.kv_capacity_tokens:
            room = self.cost.kv_capacity_tokens - self.ctx
            if room <= 0:
                return
        chosen = self.admission.select(
            self.waiting, free_slots=free, token_budget=self.max_batched_tokens, num_running=len(self.running)
        )
        if not chosen:
            return
        taken = set(chosen)
        for i in chosen:
            job = self.waiting[i]
            if (
                self.cost.kv_capacity_tokens
                and self.running
                and self.ctx + job.num_prefill_tokens > self.cost.kv_capacity_tokens
            ):
                taken.discard(i)
                continue
            self._start(job)
        if taken == set(range(len(taken))):  # a prefix (FCFS): one slice
            self.waiting = self.waiting[len(taken) :]
        else:
            self.waiting = [j for k, j in enumerate(self.waiting) if k not in taken]

    def _start(self, job: Job) -> None:
        if job.v_min is None:
            job.v_min = self.version
        job.v_max = self.version
        finish = self.steps + (job.turn_end - job.generated)
        self.running[job.id] = (job, self.steps, finish)
        self._ctx_base += job.prompt + job.generated - self.steps
        heapq.heappush(self._longest, (self.steps - job.prompt - job.generated, self._seq, job.id))
        if not (job.cached and self.parked.pop(job.id, None) is not None):  # no parked slot to take back
            job.cached = 0
            self._make_room()
        self._prefill += job.num_prefill_tokens
        job.cached, job.engine = 0, self.index
        heapq.heappush(self._heap, (finish, self._seq, job.id))
        self._seq += 1

    # ---- what the cluster does to it ---------------------------------------------------------------
    def take(self, n: int) -> list[Job]:
        """Up to `n` requests for another engine (long-tail migration), each keeping its tokens: the last
        in line first, then the running ones that generated the fewest tokens, the latest admitted among
        equals; one keeps running (the real fleet's rule, `schedrl.engine.migration`)."""
        out: list[Job] = []
        while self.waiting and len(out) < n:
            out.append(self.waiting.pop())
        movable = min(n - len(out), len(self.running) - 1)
        if movable > 0:
            moving = sorted(
                self.running.values(),
                key=lambda r: (r[0].generated + self.steps - r[1], -r[1]),
            )[:movable]
            for job, c0, _ in moving:
                del self.running[job.id]
                self._ctx_base -= job.prompt + job.generated - c0
                job.generated += self.steps - c0
                out.append(job)
            self._heap = [entry for entry in self._heap if entry[2] in self.running]
            heapq.heapify(self._heap)
        return out

    def park(self, job: Job, until: float) -> None:
        """Keep `job`'s keys and values in its slot until `until` (pin); slots past their time are freed."""
        now = self.clock
        for rid in [rid for rid, (_, t) in self.parked.items() if t < now]:
            del self.parked[rid]
            self.expired += 1
        self.parked[job.id] = (job, until)

    def _make_room(self) -> None:
        """A request starting in a new slot: if running and parked ones hold all `max_batch` +
        `park_slots`, the parked one closest to its expiry is evicted (one whose answer is back, last)."""
        while self.parked and len(self.running) + len(self.parked) > self.cost.max_batch + self.park_slots:
            first = min(self.parked, key=lambda rid: self.parked[rid][1])
            del self.parked[first]
            self.evicted += 1

    def parked_at(self, job: Job, at: float) -> bool:
        """Whether `job`'s keys and values are still here when its answer is handed on at `at`; a late
        one is dropped (expired). One back in time stays parked until the job is admitted again, and
        no longer expires: only a lack of park slots evicts it, last (as the built-in engine does)."""
        entry = self.parked.get(job.id)
        if entry is not None and at > entry[1]:
            del self.parked[job.id]
            self.expired += 1
            return False
        if entry is not None:
            self.parked[job.id] = (job, float("inf"))
        return entry is not None

    def submit(self, jobs: Sequence[Job], front: bool = False) -> None:
        """Queue `jobs` at the back, or at the `front`; a job with a priority above 0 goes ahead of every
        waiting job of lower priority (a priority-aware admission: returning trajectories first)."""
        if front:
            self.waiting[:0] = jobs
            return
        for job in jobs:
            if job.priority > 0:
                at = next(
                    (i for i, w in enumerate(self.waiting) if w.priority < job.priority), len(self.waiting)
                )
                self.waiting.insert(at, job)
            else:
                self.waiting.append(job)

    def hold(self, start: float, end: float) -> None:
        """The devices go to the learner from `start` to `end` (colocated): nothing runs meanwhile."""
        self.pause_until = max(self.pause_until, end)
        self._span("offload", max(start, self.clock), end)
        self.held_s += end - start

    def load_weights(self, version: int, at: float, seconds: float) -> None:
        """New weights from `at`: the engine pauses `seconds` (running requests keep their state)."""
        start = max(at, self.clock, self.pause_until)
        self.pause_until = start + seconds
        self._span("weight-sync", start, self.pause_until)
        self.version = version
        for job, _, _ in self.running.values():
            job.v_max = version

    def cut(self) -> list[Job]:
        """Abort every running and waiting request; each keeps the tokens it has."""
        out = list(self.waiting)
        for job, c0, _ in self.running.values():
            job.generated += self.steps - c0
            out.append(job)
        self.running.clear()
        self._heap.clear()
        self._longest.clear()
        self._ctx_base = 0
        self._prefill = 0
        self.waiting = []
        return out
