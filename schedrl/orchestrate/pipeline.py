"""The asynchronous pipeline: engine workers generate while a learner worker trains.

The loop keeps the books and leaves each decision to a policy object chosen in config:

* admission -- a group goes to the engines only if `staleness.may_admit` allows it: the
  update expected to consume it is at most k versions past the engines' weights;
* consumption (`pipeline.consumption`, ``consumption/``) -- which complete groups form
  the next update's batch; tokens older than k are dropped or masked (``pipeline.stale``);
* weight sync (`pipeline.weight_sync`, ``weight_sync/``) -- when new weights reach the
  engines and what happens to the requests they hold.

With k = 0, `consumption: wave` and `weight_sync: drain` this is the synchronous loop,
sample for sample. Workers run as Ray actors, threads or in this process
(``schedrl.distributed``); the engines are an `EngineFleet`. This module never imports Ray.
"""

from __future__ import annotations

import contextlib
import logging
import time

from schedrl.contracts.workers import Backend
from schedrl.data import scored_groups
from schedrl.distributed import WorkerDiedError, WorkerStuckError, make_backend, stuck_message, wait_built
from schedrl.distributed.backend import remote, worker_name
from schedrl.distributed.workers import EngineWorker, LearnerWorker, cpu_weights
from schedrl.orchestrate.after_update import StepCallback, after_update, pauses_after
from schedrl.orchestrate.books import admit_groups, purge_stale, take_groups
from schedrl.orchestrate.buffer import Group
from schedrl.orchestrate.build import Components, sampling_params
from schedrl.orchestrate.fleet import EngineFleet, by_group
from schedrl.orchestrate.schedule import make_bound, make_consumption, make_weight_sync
from schedrl.orchestrate.step_metrics import timing_metrics
from schedrl.orchestrate.update_batch import UpdateBatch
from schedrl.rollout import group_requests
from schedrl.timeline import TIMELINE_FILE, append_spans
from schedrl.training.checkpoint import latest_checkpoint
from schedrl.types import Sample, group_of

log = logging.getLogger(__name__)
UPDATES_QUEUED = 2  # updates sent to the learner ahead of their turn (one running, one waiting)


class Pipeline:
    """The asynchronous pipeline's books: the group buffer, the sample ledger, versions and the updates
    in flight. It admits, consumes and syncs weights through its policies; `run` drives it to the end."""

    def __init__(self, c: Components, backend: Backend, on_step: StepCallback | None = None) -> None:
        self.components, self.cfg, self.settings = c, c.cfg, c.cfg.pipeline
        self.schedule = c.cfg.schedule
        self.backend, self.on_step = backend, on_step
        self.budget = self.cfg.sampling.prompts_per_step * self.cfg.sampling.group_size  # samples per update
        self.consumption = make_consumption(self.schedule, self.budget)
        self.weight_sync = make_weight_sync(self.schedule)
        self.bound = make_bound(self.schedule)
        self.version = self.started = c.start_step or 0  # updates finished / sent to the learner
        self.groups: dict[str, Group] = {}  # unconsumed groups, in issue order
        self.next_wave = 0  # data-scheduler batches drawn so far; wave w's requests derive from (seed, w)
        self.consumed: list[str] = []  # ids of consumed groups, in order: the run's sample ledger
        self.abandoned = 0  # samples aborted for good: spares and dropped groups of tail batching
        self.dropped: list[str] = []  # ids of samples dropped as too stale
        self.learner_futures: list = []  # (stats, weights) futures of the updates sent, oldest first
        self.batch_metrics: list[dict[str, float]] = []  # the batch metrics of each update sent, oldest first
        self.last_done_t = time.perf_counter()
        restarts = 0
        if "pipeline" in c.state:
            restarts = self.load_state_dict(c.state["pipeline"])
        self.weights = backend.put(cpu_weights(c.model))
        self.fleet = EngineFleet(
            backend,
            self.cfg,
            self.weights,
            self.version,
            self.settings.num_engines,
            self._on_samples,
            self._on_restart,
        )
        self.fleet.restarts = restarts
        ckpt = latest_checkpoint(c.run.ckpt_dir)
        self.learner = backend.start_learner(self.cfg, str(c.run.root), ckpt and str(ckpt))
        # the stuck clock starts once every worker is built: loading a model is not a call
        # (engines first: on threads the learner builds after them, and is not reported as slow for it)
        for workers in (self.fleet.named(range(len(self.fleet.engines))), [("learner", self.learner)]):
            wait_built(backend, workers, self.settings.worker_timeout_s or None)

    @property
    def engines(self) -> list:
        return self.fleet.engines

    @property
    def in_engine(self) -> dict[str, tuple[str, int]]:
        return self.fleet.in_engine

    @property
    def engine_restarts(self) -> int:
        return self.fleet.restarts

    # ---- admission --------------------------------------------------------------------------
    def _issue_wave(self) -> bool:
        """The next batch, as the consumption policy plans it from the data scheduler's; its groups join
        the buffer, not yet admitted. False while the policy cannot plan it yet."""
        w = self.next_wave
        plan = self.consumption.plan(self.components.data.next_batch, w)
        if plan is None:
            return False
        tasks = [t for t, _, _ in plan]
        reqs = group_requests(
            tasks,
            self.components.tokenizer,
            sampling_params(self.cfg),
            [n for _, n, _ in plan],
            seed=self.cfg.seed,
            step=w,
        )
        for (task, n, need), (gid, members) in zip(plan, by_group(reqs), strict=True):
            self.groups[gid] = Group(gid, task, members, wave=w, need=0 if need == n else need)
        self.next_wave += 1
        return True

    def _admit(self) -> None:
        if not self.weight_sync.admits(self.fleet):
            return
        admitted = admit_groups(
            self.groups,
            self.consumption,
            self.started,
            self.cfg.steps,
            self.fleet.version,
            self.bound.k,
            self._issue_wave,
        )
        self.fleet.send([r for g in admitted for r in g.to_send()], self._tasks())

    def _resend(self, groups) -> None:
        """Send every request of `groups` that is neither done nor in an engine (cut ones from their prefix)."""
        self.fleet.send(
            [r for g in groups for r in g.to_send() if r.id not in self.fleet.in_engine], self._tasks()
        )

    def _tasks(self) -> dict | None:
        """The buffered groups' tasks, for engines that run multi-turn episodes (None otherwise)."""
        if self.cfg.task.env == "single_turn":
            return None
        return {g.task.id: g.task for g in self.groups.values()}

    def _resend_cut(self) -> None:
        self._resend(g for g in self.groups.values() if g.admitted and not g.complete)

    # ---- engine results ---------------------------------------------------------------------
    def _on_samples(self, samples: list[Sample]) -> None:
        # samples of a group already consumed or dropped (spares of tail batching) are let go
        samples = [s for s in samples if self.fleet.release(s.request_id) in self.groups]
        # an episode comes scored by its environment; everything else is scored here
        finished = [s for s in samples if s.finish_reason != "aborted" and s.reward is None]
        tasks = {t.id: t for t in (self.groups[group_of(s)].task for s in finished)}
        rewards = self.components.scorer(tasks, finished) if finished else []
        for s in samples:
            if s.finish_reason == "aborted":
                self.groups[group_of(s)].partial[s.sample_index] = s
        for s, r in zip(finished, rewards, strict=True):
            self.groups[group_of(s)].done[s.sample_index] = s.with_reward(r)
        for s in samples:
            if s.finish_reason != "aborted" and s.reward is not None:
                self.groups[group_of(s)].done[s.sample_index] = s

    def _on_restart(self, index: int, group_ids: set[str]) -> None:
        """Engine `index` was replaced: send every request of the groups it held that is not in an engine."""
        self._resend(self.groups[gid] for gid in group_ids)

    # ---- consumption ------------------------------------------------------------------------
    def _purge_stale(self, update: int) -> None:
        """Drop every sample of a complete group too stale for `update`, and groups left with fewer than two."""
        complete = [g for g in self.groups.values() if g.admitted and g.complete]
        dropped, spent = purge_stale(
            self.groups,
            complete,
            self.bound,
            update,
            self.schedule.stale,
            lambda smp: smp.versions,
            lambda smp: smp.trained,
        )
        self.dropped += [smp.request_id for smp in dropped]
        for g in spent:  # its spares (tail batching: complete before all its requests finished) are let go
            spares = [
                r.id for r in g.requests if r.sample_index not in g.done and r.sample_index not in g.dropped
            ]
            self.abandoned += len(spares)
            self.fleet.abort([i for i in spares if i in self.fleet.in_engine])

    def _launch_update(self) -> bool:
        """Send the next update to the learner if its batch is ready."""
        if self.started >= self.cfg.steps:
            return False
        self._purge_stale(self.started)
        took = take_groups(self.groups, self.consumption)
        if took is None:
            return False
        groups, dropped = took
        for g in groups:
            g.trim()
            self.consumed.append(g.id)
        # spares still generating and the dropped groups' requests: aborted, their samples let go
        self.abandoned += sum(len(g.requests) - g.needed for g in groups)
        self.abandoned += sum(len(g.requests) for g in dropped)
        self.fleet.abort(
            [r.id for g in [*groups, *dropped] for r in g.requests if r.id in self.fleet.in_engine]
        )
        batch = UpdateBatch.of(groups, self.started, self.bound, self.schedule.stale, self.cfg.algo)
        self.components.data.observe(
            scored_groups([g.task for g in groups], batch.samples, batch.rewards, batch.adv)
        )
        update = remote(self.backend, self.learner, LearnerWorker.update, returns=2)
        self.learner_futures.append(update(batch.learner_batch(self.bound.k), self.started))
        self.batch_metrics.append(
            {**batch.record_metrics(self.bound, len(self.dropped)), **self.consumption.metrics()}
        )
        self.started += 1
        return True

    # ---- the loop ---------------------------------------------------------------------------
    def run(self) -> None:
        while self.version < self.cfg.steps:
            self._admit()
            if self._may_queue_update() and not self._launch_update():
                self._admit()  # dropping stale groups may have made room
            futures = self.fleet.keep_running(self.settings.engine_chunk_steps)
            futures += [self.learner_futures[0][0]] if self.learner_futures else []
            if not futures:
                raise RuntimeError(
                    f"pipeline stalled at update {self.started}: nothing in the engines, no batch "
                    f"ready ({len(self.groups)} groups buffered)"
                )
            ready = self.backend.wait(futures, timeout=self.settings.worker_timeout_s or None)
            if not ready:
                self._stuck()
                continue
            self.fleet.collect(ready)
            if self.learner_futures and any(f is self.learner_futures[0][0] for f in ready):
                self._on_update()

    def _stuck(self) -> None:
        """No call has answered for `worker_timeout_s`: name the workers that hold calls, with their stacks.
        A stuck engine actor on Ray is replaced (its groups are resent); anything else stops the run."""
        engines = [i for i in range(len(self.fleet.engines)) if self.fleet.futures[i]]
        waiting = [(worker_name(i, len(self.fleet.engines)), self.fleet.engines[i]) for i in engines]
        waiting += [("learner", self.learner)] if self.learner_futures else []
        message = stuck_message(waiting, self.backend, self.settings.worker_timeout_s)
        log.error(message)
        if self.backend.name == "ray" and engines and not self.learner_futures:
            for i in engines:
                self.fleet.restart(i, WorkerStuckError(message))
            return
        raise WorkerStuckError(message)

    def _may_queue_update(self) -> bool:
        """Whether to send the next update now: when the learner is idle, or behind one running update
        (so it starts the next as soon as this one ends) unless that one ends in an evaluation or a
        checkpoint, which must see the weights and the buffer of exactly that version."""
        if not self.learner_futures:
            return True
        return len(self.learner_futures) < UPDATES_QUEUED and not pauses_after(self.cfg, self.started)

    def _on_update(self) -> None:
        stats_f, self.weights = self.learner_futures.pop(0)
        stats = self.backend.get(stats_f)
        self.version += 1
        self.weight_sync.on_update(self.fleet, self.weights, self.version, self._resend_cut)
        if "behaviour_kl" in stats:
            self.bound.observe(stats["behaviour_kl"])
        now, batch = time.perf_counter(), self.batch_metrics.pop(0)
        metrics = {
            **batch,
            **stats,
            "reward_errors": float(self.components.scorer.errors),
            **self.components.scorer.take_metrics(),
            **timing_metrics(batch["gen_tokens"], now - self.last_done_t, stats.pop("train_s", 0.0)),
            "engine_restarts": float(self.fleet.restarts),
        }
        self.last_done_t = now
        self._after_update(self.version, metrics)

    def _after_update(self, done: int, metrics: dict) -> None:
        after_update(self.components, done, metrics, self.on_step, self.sync_local_weights, self.checkpoint)

    def sync_local_weights(self) -> None:
        """Load the latest weights into this process's model and engine (evaluation)."""
        w = self.backend.get(self.weights) if not isinstance(self.weights, dict) else self.weights
        self.components.model.load_state_dict(w)
        self.components.engine.update_weights(w, self.version)

    def checkpoint(self, done: int) -> None:
        """Cut the engines so the buffer holds every unconsumed sample, save, then resume generation."""
        self.fleet.cut()
        self.fleet.flush()
        self.write_timeline()
        self.components.state["pipeline"] = self.state_dict()
        self.components.state["data"] = self.components.data.state_dict()
        self.components.logger.sync()
        save = remote(self.backend, self.learner, LearnerWorker.save_checkpoint)
        self.backend.get(save(done, self.components.state))
        if done < self.cfg.steps:
            self._resend_cut()

    def write_timeline(self) -> None:
        spans = self.fleet.spans()
        with contextlib.suppress(WorkerDiedError):
            spans += self.backend.get(remote(self.backend, self.learner, LearnerWorker.spans)())
        append_spans(self.components.run.root / TIMELINE_FILE, sorted(spans, key=lambda s: s.start))

    # ---- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "version": self.version,
            "next_wave": self.next_wave,
            "bound": self.bound.state_dict(),
            "groups": [g.to_dict() for g in self.groups.values()],
            "consumed": self.consumed,
            "dropped": self.dropped,
            "engine_restarts": self.fleet.restarts,
            "consumption": self.consumption.state_dict(),
            "abandoned": self.abandoned,
        }

    def load_state_dict(self, state: dict) -> int:
        """Restore the books from a checkpoint; returns the engine restarts so far."""
        if state["version"] != self.version:
            raise ValueError(
                f"pipeline state is for version {state['version']}, the checkpoint for {self.version}"
            )
        self.next_wave = state["next_wave"]
        self.bound.load_state_dict(state["bound"])
        self.groups = {}
        for d in state["groups"]:
            g = Group.from_dict(d)
            g.admitted = False  # nothing is in a fresh engine: admission sends them again, in order
            self.groups[g.id] = g
        self.consumed, self.dropped = list(state["consumed"]), list(state["dropped"])
        self.consumption.load_state_dict(state.get("consumption", {}))
        self.abandoned = int(state.get("abandoned", 0))
        return int(state["engine_restarts"])


def run_pipeline(c: Components, on_step: StepCallback | None = None) -> None:
    """Train `c` from its current step to `cfg.steps` with the asynchronous pipeline."""
    p = c.cfg.pipeline
    backend = make_backend(
        p.backend,
        address=p.ray_address,
        num_engines=p.num_engines,
        engine_cpus=p.engine_cpus,
        learner_cpus=p.learner_cpus,
    )
    stuck = False
    backend.timeout_s = p.worker_timeout_s or None  # every call a worker does not answer in time is stuck
    try:
        pipe = Pipeline(c, backend, on_step)
        try:
            pipe.run()
        except WorkerStuckError:
            stuck = True
            raise
        finally:
            if not stuck:  # a stuck worker would not answer
                try:
                    pipe.write_timeline()
                except Exception as err:  # a dead worker must not hide the original error
                    log.warning("could not collect the timeline: %s", err)
                # Engines with resources of their own (vLLM) shut down now, in order: left to the garbage
                # collector, a vLLM engine's teardown would run at any time and take the process-wide
                # state of a newer one in the same process with it.
                for engine in pipe.engines:
                    try:
                        pipe.backend.get(remote(pipe.backend, engine, EngineWorker.close)())
                    except Exception as err:
                        log.warning("could not close an engine: %s", err)
    finally:
        backend.shutdown(wait=not stuck)
