"""The asynchronous pipeline: an engine worker generates while a learner worker trains.

One loop owns every scheduling decision, on plain data:

* admission -- which groups go to the engine, bounded by the staleness bound k
  (``schedrl.orchestrate.staleness``);
* consumption -- which complete groups form the next update's batch, and what
  happens to tokens older than k (``pipeline.stale``: drop the sample, or keep the
  token as context only); without partial rollouts a step takes exactly its own
  wave of groups, with them it takes the oldest complete ones and the rest carry over;
* weight sync -- new weights reach the engine between decode steps
  (``inflight_weight_updates``), after cutting the running requests (partial
  rollouts: they resume from their prefix under the new weights), or once the
  engine has drained.

With k = 0 and both options off this is the synchronous loop, sample for sample.
Workers run as Ray actors or in this process (``schedrl.distributed``); this module
never imports Ray. There may be several engine workers (``pipeline.num_engines``):
each admitted group goes whole to the one holding the fewest requests, and weight
pushes, cuts and restarts go to each of them.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable

import torch

from schedrl.algos import registry
from schedrl.config import config_to_dict
from schedrl.data import scored_groups
from schedrl.distributed import WorkerDiedError, make_backend
from schedrl.distributed.workers import cpu_weights
from schedrl.orchestrate.buffer import Group
from schedrl.orchestrate.build import Components
from schedrl.orchestrate.staleness import AutoStaleness, StalenessBound, expected_update
from schedrl.orchestrate.step_metrics import rollout_metrics, timing_metrics
from schedrl.orchestrate.sync import run_eval, sampling_params
from schedrl.rollout import group_index, group_requests
from schedrl.timeline import TIMELINE_FILE, append_spans
from schedrl.train.checkpoint import latest_checkpoint
from schedrl.types import Sample

log = logging.getLogger(__name__)
RUN_CALLS_QUEUED = 2  # `run` calls kept queued on each engine
UPDATES_QUEUED = 2  # updates sent to the learner ahead of their turn (one running, one waiting)


def make_bound(p) -> StalenessBound:
    if p.max_staleness == "auto":
        return AutoStaleness(k=p.staleness_min, k_min=p.staleness_min, k_max=p.staleness_max,
                             low=p.auto_low, high=p.auto_high)  # fmt: skip
    return StalenessBound(p.max_staleness)


class Pipeline:
    def __init__(self, c: Components, backend, on_step: Callable[[int, dict], None] | None = None) -> None:
        self.c, self.cfg, self.p = c, c.cfg, c.cfg.pipeline
        self.backend, self.on_step = backend, on_step
        self.budget = self.cfg.sampling.prompts_per_step * self.cfg.sampling.group_size  # samples per update
        self.per_step = round(self.budget * self.p.overprovision) if self.p.partial_rollouts else self.budget
        self.data = c.data  # the data scheduler: each wave is one of its batches
        self.bound = make_bound(self.p)
        start = c.start_step or 0
        self.version = self.started = self.engine_version = start
        self.groups: dict[str, Group] = {}  # unconsumed groups, in issue order
        self.next_wave = 0  # data-scheduler batches drawn so far; wave w's requests derive from (seed, w)
        self.consumed: list[str] = []  # ids of consumed groups, in order: the run's sample ledger
        self.dropped: list[str] = []  # ids of samples dropped as too stale
        self.engine_restarts = 0
        self.in_engine: dict[str, tuple[str, int]] = {}  # request id -> (group id, engine worker holding it)
        self.learner_futures: list = []  # (stats, weights) futures of the updates sent, oldest first
        self.pending_weights = None  # weights waiting for the engine to drain (no in-flight updates)
        self.batch_metrics: list[dict[str, float]] = []  # the batch metrics of each update sent, oldest first
        self.last_done_t = time.perf_counter()
        if "pipeline" in c.state:
            self.load_state_dict(c.state["pipeline"])
        self.weights = backend.put(cpu_weights(c.model))
        self.engines = [self._start_engine(i) for i in range(self.p.num_engines)]
        # Each engine's outstanding `run` calls, oldest first. Two are kept queued, so an engine starts its
        # next chunk while this loop handles the last one's samples, instead of idling for the round trip.
        self.engine_futures: list[list] = [[] for _ in self.engines]
        ckpt = latest_checkpoint(c.run.ckpt_dir)
        self.learner = backend.start_learner(config_to_dict(self.cfg), str(c.run.root), ckpt and str(ckpt))

    # ---- workers ----------------------------------------------------------------------------
    def _start_engine(self, index: int):
        return self.backend.start_engine(config_to_dict(self.cfg), self.weights, self.version, index)

    def _restart_engine(self, i: int, err: Exception) -> None:
        """Engine `i` died: start a new one with the current weights and resend what it held."""
        self.engine_restarts += 1
        log.warning("engine worker %d died (%s); restarting it (restart %d)", i, err, self.engine_restarts)
        if self.engine_restarts > 3:
            raise RuntimeError(f"engine worker died {self.engine_restarts} times; last error: {err}") from err
        self.backend.kill(self.engines[i])
        self.engine_futures[i] = []
        # Every engine gets the current weights: the new one starts on them, the others catch up now.
        if self.pending_weights is not None:
            self._push_weights(*self.pending_weights, skip=i)
            self.pending_weights = None
        self.engines[i] = self._start_engine(i)
        self.engine_version = self.version
        lost = [rid for rid, (_, e) in self.in_engine.items() if e == i]
        groups = {self.in_engine.pop(rid)[0] for rid in lost}
        self._send([r for gid in groups for r in self.groups[gid].to_send() if r.id not in self.in_engine])

    def _get_engine(self, i: int, future):
        try:
            return self.backend.get(future)
        except WorkerDiedError as err:
            self._restart_engine(i, err)
            return None

    # ---- admission --------------------------------------------------------------------------
    def _issue_wave(self) -> None:
        """Draw the next batch from the data scheduler; its groups join the buffer, not yet admitted."""
        w = self.next_wave
        plan = self.data.next_batch(self.budget)
        tasks = [t for t, _ in plan]
        reqs = group_requests(tasks, self.c.tokenizer, sampling_params(self.cfg), [n for _, n in plan],
                              seed=self.cfg.seed, step=w)  # fmt: skip
        for task, (gid, members) in zip(tasks, _by_group(reqs), strict=True):
            self.groups[gid] = Group(gid, task, members, wave=w)
        self.next_wave += 1

    def _size(self, g: Group) -> int:
        return len(g.requests) - len(g.dropped)

    def _expected_update(self, g: Group) -> int:
        """The update that will consume `g` if admitted now."""
        if not self.p.partial_rollouts:  # one wave per update, in order
            return self.started + g.wave - min(h.wave for h in self.groups.values())
        ahead = sum(self._size(h) for h in self.groups.values() if h.admitted)
        return expected_update(self.started, ahead, self.per_step)

    def _admit(self) -> None:
        if self.pending_weights is not None:
            return  # draining for a weight update
        out = []
        while True:
            g = next((g for g in self.groups.values() if not g.admitted), None)
            if g is None:  # every buffered group is in flight: draw the next batch
                self._issue_wave()
                continue
            expected = self._expected_update(g)
            if expected >= self.cfg.steps or expected > self.engine_version + self.bound.k:
                break
            g.admitted = True
            out += g.to_send()
        self._send(out)

    def _send(self, requests) -> None:
        """Hand `requests` to the engines, each group to the engine holding the fewest requests."""
        load = Counter(e for _, e in self.in_engine.values())
        per_engine: dict[int, list] = {}
        for _, members in _by_group(requests):
            i = min(range(len(self.engines)), key=lambda e: (load[e], e))
            load[i] += len(members)
            per_engine.setdefault(i, []).extend(members)
            for r in members:
                self.in_engine[r.id] = (r.group_id, i)
        for i, reqs in sorted(per_engine.items()):
            self.backend.call(self.engines[i], "add", reqs)

    # ---- engine results ---------------------------------------------------------------------
    def _on_samples(self, samples: list[Sample]) -> None:
        finished = [s for s in samples if s.finish_reason != "aborted"]
        tasks = {t.id: t for t in (self.groups[self.in_engine[s.request_id][0]].task for s in finished)}
        rewards = self.c.scorer(tasks, finished) if finished else []
        for s in samples:
            g = self.groups[self.in_engine.pop(s.request_id)[0]]
            if s.finish_reason == "aborted":
                g.partial[s.sample_index] = s
        for s, r in zip(finished, rewards, strict=True):
            self.groups[s.group_id].done[s.sample_index] = s.with_reward(r)

    def _cut_engines(self) -> None:
        """Abort everything in the engines; the cut samples wait in their groups to resume."""
        while self.in_engine:
            busy = self._busy_engines()
            aborts = {i: self.backend.call(self.engines[i], "abort_all") for i in busy}
            for i in busy:
                outs = [*self.engine_futures[i], aborts[i]]
                self.engine_futures[i] = []
                for f in outs:
                    out = self._get_engine(i, f)
                    if out is None:  # died and restarted: what it held was resent; cut again
                        break
                    self._on_samples(out)

    def _busy_engines(self) -> list[int]:
        return sorted({e for _, e in self.in_engine.values()})

    def _resend_cut(self) -> None:
        self._send([r for g in self.groups.values() if g.admitted and not g.complete
                    for r in g.to_send() if r.id not in self.in_engine])  # fmt: skip

    def _push_weights(self, weights, version: int, skip: int | None = None) -> None:
        for i, engine in enumerate(self.engines):
            if i != skip:
                self.backend.call(engine, "update_weights", weights, version)
        self.engine_version = version

    # ---- consumption ------------------------------------------------------------------------
    def _trainable(self, update: int, smp: Sample) -> list[bool] | None:
        """Per-token trained mask of `smp` at `update`, or None when the sample must be dropped."""
        fresh = self.bound.fresh_mask(update, smp.versions)
        if all(fresh) or (self.p.stale == "mask" and any(fresh)):
            return fresh
        return None

    def _purge_stale(self, update: int) -> None:
        """Drop every sample of a complete group too stale for `update`, and groups left with fewer than two."""
        for g in [g for g in self.groups.values() if g.admitted and g.complete]:
            for i, smp in list(g.done.items()):
                if self._trainable(update, smp) is None:
                    del g.done[i]
                    g.dropped.append(i)
                    self.dropped.append(smp.request_id)
            if len(g.requests) - len(g.dropped) < 2:  # no group baseline left: the group is spent
                self.dropped += [smp.request_id for smp in g.done.values()]
                del self.groups[g.id]

    def _take_batch(self) -> tuple[list[Sample], list[list[bool]]] | None:
        """The next update's samples with their trained-token masks, or None while they are not ready.

        Without partial rollouts the update takes the oldest wave (one data-scheduler batch) and
        waits for all of it; with partial rollouts it takes the oldest complete groups until they
        hold a step's worth of samples.
        """
        self._purge_stale(self.started)
        admitted = [g for g in self.groups.values() if g.admitted]
        if self.p.partial_rollouts:
            groups, total = [], 0
            for g in (g for g in admitted if g.complete):
                if total >= self.budget:
                    break
                groups.append(g)
                total += self._size(g)
            if total < self.budget:
                return None
        else:
            if not admitted:
                return None
            w = min(g.wave for g in self.groups.values())
            groups = [g for g in self.groups.values() if g.wave == w]
            if not all(g.admitted and g.complete for g in groups):
                return None
        samples, masks = [], []
        self._consumed_tasks = [g.task for g in groups]
        for g in groups:
            del self.groups[g.id]
            self.consumed.append(g.id)
            for smp in g.samples():
                samples.append(smp)
                masks.append(self._trainable(self.started, smp))
        return samples, masks

    def _launch_update(self) -> bool:
        if self.started >= self.cfg.steps:
            return False
        taken = self._take_batch()
        if taken is None:
            return False
        samples, masks = taken
        s = self.started
        rewards = torch.tensor([smp.reward for smp in samples])
        groups = group_index(samples)
        adv = registry.get("advantage", self.cfg.algo.advantage)(rewards, groups,
                                                                   std_normalize=self.cfg.algo.std_normalize)
        self.data.observe(scored_groups(self._consumed_tasks, samples, rewards, adv))
        payload = {
            "prompt_ids": [list(x.prompt_ids) for x in samples], "token_ids": [list(x.token_ids) for x in samples],
            "logprobs": [list(x.logprobs) for x in samples], "versions": [list(x.versions) for x in samples],
            "train_mask": masks, "advantages": adv.tolist(), "request_ids": [x.request_id for x in samples],
            "max_staleness": self.bound.k,
        }  # fmt: skip
        self.learner_futures.append(self.backend.call(self.learner, "update", payload, s, num_returns=2))
        self.started += 1
        hist = Counter()
        for smp, m in zip(samples, masks, strict=True):
            hist += self.bound.record(s, smp.versions, m)
        n = max(1, sum(hist.values()))
        self.batch_metrics.append({
            **rollout_metrics(samples, rewards, groups),
            "staleness_mean": sum(k * v for k, v in hist.items()) / n, "staleness_max": float(max(hist, default=0)),
            **{f"staleness_hist/{k}": float(v) for k, v in sorted(hist.items())},
            "masked_tokens": float(sum(len(m) - sum(m) for m in masks)), "dropped_samples": float(len(self.dropped)),
            "max_staleness": float(self.bound.k), "batch_groups": float(int(groups.max()) + 1),
        })  # fmt: skip
        return True

    # ---- the loop ---------------------------------------------------------------------------
    def run(self) -> None:
        steps = self.cfg.steps
        while self.version < steps:
            if self.pending_weights is not None and not self.in_engine:
                self._push_weights(*self.pending_weights)
                self.pending_weights = None
            self._admit()
            if self._may_queue_update() and not self._launch_update():
                self._admit()  # dropping stale groups may have made room
            for i in self._busy_engines():
                while len(self.engine_futures[i]) < RUN_CALLS_QUEUED:
                    self.engine_futures[i].append(self.backend.call(self.engines[i], "run", self.p.engine_chunk_steps))
            futures = [f for fs in self.engine_futures for f in fs]
            futures += [self.learner_futures[0][0]] if self.learner_futures else []
            if not futures:
                raise RuntimeError(f"pipeline stalled at update {self.started}: nothing in the engines, no batch "
                                   f"ready ({len(self.groups)} groups buffered)")  # fmt: skip
            ready = self.backend.wait(futures)
            for i, queue in enumerate(self.engine_futures):
                # An engine runs its calls in order: everything up to its last ready call is done.
                n = max((k + 1 for k, f in enumerate(queue) if any(r is f for r in ready)), default=0)
                done, self.engine_futures[i] = queue[:n], queue[n:]
                for f in done:
                    out = self._get_engine(i, f)
                    if out is None:  # died and restarted: its queue is gone
                        break
                    self._on_samples(out)
            if self.learner_futures and any(f is self.learner_futures[0][0] for f in ready):
                self._on_update()

    def _may_queue_update(self) -> bool:
        """Whether to send the next update now: when the learner is idle, or behind one running update
        (so it starts the next as soon as this one ends) unless that one ends in an evaluation or a
        checkpoint, which must see the weights and the buffer of exactly that version."""
        if not self.learner_futures:
            return True
        done = self.started  # the version the last update sent produces
        e, every = self.cfg.eval.every, self.cfg.save_every
        pauses = (every and done % every == 0) or (e and done % e == 0)  # past the last step nothing is sent
        return len(self.learner_futures) < UPDATES_QUEUED and not pauses

    def _on_update(self) -> None:
        stats_f, weights = self.learner_futures.pop(0)
        stats = self.backend.get(stats_f)
        self.version += 1
        self.weights = weights
        if self.p.inflight_weight_updates:
            self._push_weights(weights, self.version)
        elif self.p.partial_rollouts:
            self._cut_engines()
            self._push_weights(weights, self.version)
            self._resend_cut()
        elif not self.in_engine:
            self._push_weights(weights, self.version)
        else:
            self.pending_weights = (weights, self.version)
        if "behaviour_kl" in stats:
            self.bound.observe(stats["behaviour_kl"])
        now = time.perf_counter()
        batch = self.batch_metrics.pop(0)
        metrics = {**batch, **stats, "reward_errors": float(self.c.scorer.errors),
                   **timing_metrics(batch["gen_tokens"], now - self.last_done_t, stats.pop("train_s")),
                   "engine_restarts": float(self.engine_restarts)}  # fmt: skip
        self.last_done_t = now
        self._after_update(self.version, metrics)

    def _after_update(self, done: int, metrics: dict) -> None:
        cfg, c = self.cfg, self.c
        if cfg.eval.every and done % cfg.eval.every == 0 and done < cfg.steps:
            self.sync_local_weights()
            metrics |= {f"eval/{k}": v for k, v in run_eval(c).items()}
        c.logger.log(done, metrics)
        if self.on_step is not None:
            self.on_step(done, metrics)
        if done == cfg.steps or (cfg.save_every and done % cfg.save_every == 0):
            if done == cfg.steps:
                self.sync_local_weights()
                c.state["eval_after"] = run_eval(c)
                c.logger.log(done, {f"eval/{k}": v for k, v in c.state["eval_after"].items()})
            self.checkpoint(done)

    def sync_local_weights(self) -> None:
        """Load the latest weights into this process's model and engine (evaluation)."""
        w = self.backend.get(self.weights) if not isinstance(self.weights, dict) else self.weights
        self.c.model.load_state_dict(w)
        self.c.engine.update_weights(w, self.version)

    def checkpoint(self, done: int) -> None:
        """Cut the engines so the buffer holds every unconsumed sample, save, then resume generation."""
        self._cut_engines()
        if self.pending_weights is not None:
            self._push_weights(*self.pending_weights)
            self.pending_weights = None
        self.write_timeline()
        self.c.state["pipeline"] = self.state_dict()
        self.c.state["data_position"] = self.next_wave
        self.c.state["data"] = self.data.state_dict()
        self.c.logger.sync()
        self.backend.get(self.backend.call(self.learner, "save_checkpoint", done, self.c.state))
        if done < self.cfg.steps:
            self._resend_cut()

    def write_timeline(self) -> None:
        spans = []
        for worker in (*self.engines, self.learner):
            with contextlib.suppress(WorkerDiedError):
                spans += self.backend.get(self.backend.call(worker, "spans"))
        append_spans(self.c.run.root / TIMELINE_FILE, sorted(spans, key=lambda s: s.start))

    # ---- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "version": self.version, "next_wave": self.next_wave, "bound": self.bound.state_dict(),
            "groups": [g.to_dict() for g in self.groups.values()], "consumed": self.consumed,
            "dropped": self.dropped, "engine_restarts": self.engine_restarts,
        }  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        if state["version"] != self.version:
            raise ValueError(f"pipeline state is for version {state['version']}, the checkpoint for {self.version}")
        self.next_wave = state["next_wave"]
        self.bound.load_state_dict(state["bound"])
        self.groups = {}
        for d in state["groups"]:
            g = Group.from_dict(d)
            g.admitted = False  # nothing is in a fresh engine: admission sends them again, in order
            self.groups[g.id] = g
        self.consumed, self.dropped = list(state["consumed"]), list(state["dropped"])
        self.engine_restarts = state["engine_restarts"]


def _by_group(requests) -> list[tuple[str, list]]:
    out: dict[str, list] = {}
    for r in requests:
        out.setdefault(r.group_id, []).append(r)
    return list(out.items())


def run_pipeline(c: Components, on_step=None) -> None:
    """Train `c` from its current step to `cfg.steps` with the asynchronous pipeline."""
    p = c.cfg.pipeline
    backend = make_backend(p.backend, address=p.ray_address, num_engines=p.num_engines, engine_cpus=p.engine_cpus,
                           learner_cpus=p.learner_cpus)  # fmt: skip
    try:
        pipe = Pipeline(c, backend, on_step)
        try:
            pipe.run()
        finally:
            try:
                pipe.write_timeline()
            except Exception as err:  # a dead worker must not hide the original error
                log.warning("could not collect the timeline: %s", err)
    finally:
        backend.shutdown()
