"""The engine workers of the asynchronous pipeline: where each request is, and what reaches them.

The fleet sends each group whole (each request, under `schedule.divide_groups`) to the engine
holding the fewest requests, moves requests from the busiest engine to one that ran dry (under
`schedule.migrate`, JigsawRL's long-tail migration: `engine.migration` picks them), keeps two
`run` calls queued on every busy engine (so an engine starts its next chunk while the
loop handles the last one's samples), cuts every request (abort, prefix kept), pushes
weights to every engine, and replaces an engine that died. It decides nothing about
*when*: the weight-sync policy and the pipeline's loop do.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from schedrl.config import RunConfig
from schedrl.contracts.workers import Backend
from schedrl.distributed import WorkerDiedError, WorkerStuckError, wait_built
from schedrl.distributed.backend import remote, worker_name
from schedrl.distributed.errors import InputLostError
from schedrl.distributed.workers import EngineWorker
from schedrl.types import Request, Sample, group_of

log = logging.getLogger(__name__)
RUN_CALLS_QUEUED = 2  # `run` calls kept queued on each engine
MAX_RESTARTS = 3


def by_group(requests: Sequence[Request]) -> list[tuple[str, list[Request]]]:
    """Requests grouped by group id, groups and members in order of appearance."""
    out: dict[str, list[Request]] = {}
    for r in requests:
        out.setdefault(group_of(r), []).append(r)
    return list(out.items())


class EngineFleet:
    """`num_engines` engine workers on a backend, started on `weights` at `version`.

    `on_samples(samples)` receives every finished or cut sample; `on_restart(index, group_ids)`
    is called after engine `index` died and was replaced, with the groups it held, so their
    requests can be sent again; `on_moved(index, samples)` after `on_samples` has had the samples cut
    for a migration to engine `index`, so that they resume there (`send(..., to=index)`).
    """

    def __init__(
        self,
        backend: Backend,
        cfg: RunConfig,
        weights: Any,
        version: int,
        num_engines: int,
        on_samples: Callable[[list[Sample]], None],
        on_restart: Callable[[int, set[str]], None],
        on_moved: Callable[[int, list[Sample]], None] | None = None,
        reward_source: Any = None,
    ) -> None:
        """`reward_source`: the task each engine worker scores its finished samples with, between its
        engine steps (`pipeline.reward_placement: colocated`); None: they come back unscored."""
        self.backend, self.cfg = backend, cfg
        self.on_samples, self.on_restart, self.on_moved = on_samples, on_restart, on_moved
        self.weights, self.version = weights, version  # the weights the engines hold (or will, once pushed)
        self.start_weights = (
            weights  # full weights a replacement engine starts on (later ones may be adapters)
        )
        self.staged: tuple[Any, int] | None = None  # weights waiting to be pushed (see `stage`)
        self.restarts = 0
        self.divide = bool(cfg.schedule.divide_groups)  # each request on its own: Seer's divided rollout
        self.migrate = bool(cfg.schedule.migrate) and on_moved is not None
        self.handing: list[tuple[Any, int, int]] = []  # (hand-over call, from, to engine), at most one
        self.migrated = 0  # requests moved between engines
        self.in_engine: dict[str, tuple[str, int]] = {}  # request id -> (group id, engine index)
        self.reward = {"reward_source": reward_source} if reward_source is not None else {}
        self.engines = [
            backend.start_engine(cfg, weights, version, i, **self.reward) for i in range(num_engines)
        ]
        self.futures: list[list] = [[] for _ in self.engines]  # each engine's outstanding `run` calls

    @property
    def idle(self) -> bool:
        return not self.in_engine

    def busy(self) -> list[int]:
        return sorted({e for _, e in self.in_engine.values()})

    def send(
        self, requests: Sequence[Request], tasks: Mapping[str, Any] | None = None, to: int | None = None
    ) -> None:
        """Hand `requests` to the engines, each group to the engine holding the fewest requests (all to
        engine `to`, if given); `tasks` (task id -> Task) go along for engines that run multi-turn
        episodes or score their samples."""
        load = Counter(e for _, e in self.in_engine.values())
        per_engine: dict[int, list[Request]] = {}
        units = [[r] for r in requests] if self.divide else [members for _, members in by_group(requests)]
        for members in units:
            i = to if to is not None else min(range(len(self.engines)), key=lambda e: (load[e], e))
            load[i] += len(members)
            per_engine.setdefault(i, []).extend(members)
            for r in members:
                self.in_engine[r.id] = (group_of(r), i)
        for i, reqs in sorted(per_engine.items()):
            if tasks is None:
                remote(self.backend, self.engines[i], EngineWorker.add)(reqs)
            else:
                mine = {t: tasks[t] for t in (r.task_id for r in reqs) if t is not None and t in tasks}
                remote(self.backend, self.engines[i], EngineWorker.add)(reqs, mine)

    def group_of(self, request_id: str) -> str:
        return self.in_engine[request_id][0]

    def release(self, request_id: str) -> str:
        """Forget a request that came back; returns its group id."""
        return self.in_engine.pop(request_id)[0]

    def push(self, weights: Any, version: int, skip: int | None = None) -> None:
        """Send `weights` (policy `version`) to every engine but `skip`; they take them between decode steps."""
        for i, engine in enumerate(self.engines):
            if i != skip:  # queued with the engine's calls: a push that fails is raised when collected
                self.futures[i].append(
                    remote(self.backend, engine, EngineWorker.update_weights)(weights, version)
                )
        self.weights, self.version = weights, version

    def stage(self, weights: Any, version: int) -> None:
        """Hold `weights` back until `flush`: the engines finish what they hold on the old ones."""
        self.staged = (weights, version)

    def flush(self, skip: int | None = None) -> None:
        """Push the staged weights, if any."""
        if self.staged is not None:
            self.push(*self.staged, skip=skip)
            self.staged = None

    def keep_running(self, chunk_steps: int) -> list:
        """Queue `run` calls on every busy engine; returns every outstanding call."""
        for i in self.busy():
            while len(self.futures[i]) < RUN_CALLS_QUEUED:
                self.futures[i].append(remote(self.backend, self.engines[i], EngineWorker.run)(chunk_steps))
        return [f for fs in self.futures for f in fs]

    def collect(self, ready: Sequence) -> None:
        """Hand the samples of every finished call to `on_samples`, in each engine's order (and those a
        hand-over cut to `on_moved`)."""
        for i, queue in enumerate(self.futures):
            # An engine runs its calls in order: everything up to its last ready call is done.
            n = max((k + 1 for k, f in enumerate(queue) if any(r is f for r in ready)), default=0)
            done, self.futures[i] = queue[:n], queue[n:]
            for f in done:
                dst = self._handed(f)
                out = self._get(i, f)
                if out is None:  # died and restarted: its queue is gone
                    break
                if not isinstance(out, list):  # a weight push's acknowledgement
                    continue
                self.on_samples(out)
                moved = [s for s in out if s.finish_reason == "aborted"]
                if dst is not None and moved and self.on_moved is not None:
                    self.migrated += len(moved)
                    self.on_moved(dst, moved)

    def rebalance(self) -> None:
        """Long-tail migration: an engine holding nothing takes half the requests of the engine holding
        the most (two or more), one hand-over at a time."""
        if not self.migrate or self.handing:
            return
        load = Counter(e for _, e in self.in_engine.values())
        dry = [i for i in range(len(self.engines)) if load[i] == 0]
        src = max(range(len(self.engines)), key=lambda e: (load[e], -e))
        if not dry or load[src] < 2:
            return
        call = remote(self.backend, self.engines[src], EngineWorker.hand_over)(load[src] // 2)
        self.futures[src].append(call)
        self.handing.append((call, src, dry[0]))

    def _handed(self, future) -> int | None:
        """The engine a finished hand-over call's requests go to (None: not a hand-over)."""
        for k, (f, _, dst) in enumerate(self.handing):
            if f is future:
                del self.handing[k]
                return dst
        return None

    def abort(self, request_ids: Sequence[str]) -> None:
        """Abort these requests where they run; what they held comes back to `on_samples` as aborted (a
        request that finished meanwhile comes back finished)."""
        per_engine: dict[int, list[str]] = {}
        for rid in request_ids:
            per_engine.setdefault(self.in_engine[rid][1], []).append(rid)
        for i, ids in sorted(per_engine.items()):
            self.futures[i].append(remote(self.backend, self.engines[i], EngineWorker.abort)(ids))

    def cut(self) -> None:
        """Abort everything in the engines; the cut samples go to `on_samples` with their prefixes."""
        self.handing = []  # a hand-over's samples come back cut, to resume with the rest
        while self.in_engine:
            busy = self.busy()
            aborts = {i: remote(self.backend, self.engines[i], EngineWorker.abort_all)() for i in busy}
            for i in busy:
                outs = [*self.futures[i], aborts[i]]
                self.futures[i] = []
                for f in outs:
                    out = self._get(i, f)
                    if out is None:  # died and restarted: what it held was resent; cut again
                        break
                    if isinstance(out, list):  # not a weight push's acknowledgement
                        self.on_samples(out)

    def _get(self, i: int, future) -> Any:
        try:
            return self.backend.get(future)
        except InputLostError:
            raise  # the engine is alive; what it was sent is gone: restarting it would not help
        except WorkerDiedError as err:
            self.restart(i, err)
            return None
        except WorkerStuckError as err:
            if self.backend.name != "ray":
                raise
            self.restart(i, err)  # an actor can be replaced; a thread cannot be stopped
            return None

    def restart(self, i: int, err: Exception) -> None:
        """Engine `i` died (or is stuck): start a new one on the latest weights; `on_restart` resends what it held."""
        self.restarts += 1
        log.warning("engine worker %d died (%s); restarting it (restart %d)", i, err, self.restarts)
        if self.restarts > MAX_RESTARTS:
            raise RuntimeError(f"engine worker died {self.restarts} times; last error: {err}") from err
        self.backend.kill(self.engines[i])
        self.futures[i] = []
        self.handing = [h for h in self.handing if h[1] != i]  # a hand-over from it will not answer
        self.flush(skip=i)  # every engine gets the latest weights: the new one starts on them
        self.engines[i] = self.backend.start_engine(
            self.cfg, self.start_weights, self.version, i, **self.reward
        )
        push = remote(self.backend, self.engines[i], EngineWorker.update_weights)(self.weights, self.version)
        self.futures[i].append(push)
        wait_built(self.backend, self.named([i]), self.cfg.pipeline.worker_timeout_s or None)
        lost = [rid for rid, (_, e) in self.in_engine.items() if e == i]
        self.on_restart(i, {self.in_engine.pop(rid)[0] for rid in lost})

    def named(self, indices: Sequence[int]) -> list[tuple[str, Any]]:
        """(timeline name, worker) of engines `indices`."""
        return [(worker_name(i, len(self.engines)), self.engines[i]) for i in indices]

    def counters(self) -> dict[str, float]:
        """The engines' cumulative episode counts, summed (rates and means of the session pools are
        averaged over the engines that have them)."""
        total: dict[str, float] = {}
        seen: dict[str, int] = {}
        for engine in self.engines:
            try:
                counts = self.backend.get(remote(self.backend, engine, EngineWorker.counters)())
            except WorkerDiedError:
                continue
            for k, v in counts.items():
                total[k] = total.get(k, 0.0) + v
                seen[k] = seen.get(k, 0) + 1
        return {k: v / seen[k] if k.endswith(("_rate", "_mean")) else v for k, v in total.items()}

    def spans(self) -> list:
        spans = []
        for engine in self.engines:
            try:
                spans += self.backend.get(remote(self.backend, engine, EngineWorker.spans)())
            except WorkerDiedError:
                continue
        return spans
