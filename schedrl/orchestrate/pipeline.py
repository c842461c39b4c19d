"""Training on the real clock: engine workers generate while a learner worker trains.

`Pipeline` is the `Loop`'s cluster for a training run: the engines are an `EngineFleet` of engine
workers, the learner a learner worker, on the local, threads or Ray backend (``schedrl.distributed``).
It turns a batch the loop issues into requests, scores samples as they come back, builds an update's
batch and sends it to the learner; every decision is the loop's. With the schedule's defaults (k = 0,
`wave`, `drain`) this is the synchronous loop, sample for sample. This module never imports Ray.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from schedrl.contracts.workers import Backend
from schedrl.data import scored_groups
from schedrl.distributed import WorkerDiedError, WorkerStuckError, make_backend, stuck_message, wait_built
from schedrl.distributed.backend import remote, worker_name
from schedrl.distributed.workers import EngineWorker, LearnerWorker, RewardWorker, cpu_weights
from schedrl.engine.weight_push import WeightPush, receive
from schedrl.envs.scoring import needs_reward, resolves, reward_delay
from schedrl.orchestrate.after_update import StepCallback, after_update, pauses_after
from schedrl.orchestrate.buffer import Group
from schedrl.orchestrate.build import Components, sampling_params
from schedrl.orchestrate.fleet import EngineFleet, by_group
from schedrl.orchestrate.loop import Finished, Loop
from schedrl.orchestrate.step_metrics import timing_metrics
from schedrl.orchestrate.update_batch import UpdateBatch
from schedrl.rollout import group_requests
from schedrl.timeline import write_spans
from schedrl.training.checkpoint import latest_checkpoint
from schedrl.training.lora import ADAPTER_DIR, AdapterBase
from schedrl.training.parallel import tied_names
from schedrl.types import Sample, group_of

log = logging.getLogger(__name__)
UPDATES_QUEUED = 2  # updates sent to the learner ahead of their turn (one running, one waiting)


def issue_groups(c: Components, wave: int, consumption) -> list[Group] | None:
    """Batch `wave` as the consumption policy plans it from the data scheduler's (None: not yet); its
    requests derive from (seed, wave)."""
    plan = consumption.plan(c.data.next_batch, wave)
    if plan is None:
        return None
    tasks = [t for t, _, _ in plan]
    params = sampling_params(c.cfg)
    reqs = group_requests(tasks, c.tokenizer, params, [n for _, n, _ in plan], seed=c.cfg.seed, step=wave)
    return [
        Group(gid, task, members, wave=wave, need=0 if need == n else need, resolves=resolves(task, wave))
        for (task, n, need), (gid, members) in zip(plan, by_group(reqs), strict=True)
    ]


class Pipeline:
    """The real clock: engine workers (an `EngineFleet`) and a learner worker, driven by the `Loop`. Samples
    are scored here as they arrive; an update's batch is built here and sent to the learner."""

    def __init__(self, c: Components, backend: Backend, on_step: StepCallback | None = None) -> None:
        self.components, self.cfg, self.settings = c, c.cfg, c.cfg.pipeline
        self.backend, self.on_step = backend, on_step
        budget = self.cfg.sampling.prompts_per_step * self.cfg.sampling.group_size  # samples per update
        self.loop = Loop(
            self.cfg.schedule, budget, self.cfg.steps, self, c.start_step or 0, reward_delay(c.source)
        )
        self.learner_futures: list = []  # (stats, weights) futures of the updates sent, oldest first
        self.batch_metrics: list[dict[str, float]] = []  # the batch metrics of each update sent, oldest first
        self.last_done_t = time.perf_counter()
        self.migrated = 0  # requests the fleet had moved between engines at the last update
        self.episode_totals: dict[str, float] = {}  # the engines' episode counts at the last update
        state = c.state.get("pipeline")
        if state is not None:
            self.loop.load_state_dict(state)
        self.weights = backend.put(cpu_weights(c.model))
        self.adapter_base = AdapterBase()  # with LoRA: this process's model's base weights
        placement = self.settings.reward_placement
        self.reward_futures: list = []  # scoring calls to the reward worker, oldest first
        self.reward_worker = backend.start_reward(self.cfg, c.source) if placement == "separate" else None
        self.fleet = EngineFleet(
            backend,
            self.cfg,
            self.weights,
            self.loop.version,
            self.settings.num_engines,
            self._on_samples,
            self._on_restart,
            self._on_moved,
            c.source if placement == "colocated" else None,
        )
        self.fleet.restarts = int(state.get("engine_restarts", 0)) if state is not None else 0
        ckpt = latest_checkpoint(c.run.ckpt_dir)
        self.learner = backend.start_learner(self.cfg, str(c.run.root), ckpt and str(ckpt))
        # the stuck clock starts once every worker is built: loading a model is not a call
        # (engines first: on threads the learner builds after them, and is not reported as slow for it)
        named = [self.fleet.named(range(len(self.fleet.engines))), [("learner", self.learner)]]
        named += [[("reward", self.reward_worker)]] if self.reward_worker is not None else []
        for workers in named:
            wait_built(backend, workers, self.settings.worker_timeout_s or None)
        if ckpt is not None and (ckpt / ADAPTER_DIR).is_dir():  # LoRA resumed: everything holds the base
            self.weights = remote(backend, self.learner, LearnerWorker.weights)(
                self.loop.version
            )  # the adapters
            self.fleet.push(self.weights, self.loop.version)

    @property
    def engines(self) -> list:
        return self.fleet.engines

    def run(self) -> None:
        self.loop.run()

    # ---- the loop's cluster -----------------------------------------------------------------
    def issue(self, wave: int, consumption) -> list[Group] | None:
        return issue_groups(self.components, wave, consumption)

    def send(self, groups: list[Group]) -> None:
        """Every request of `groups` that is neither done nor in an engine (cut ones from their prefix)."""
        requests = [r for g in groups for r in g.to_send() if r.id not in self.fleet.in_engine]
        self.fleet.send(requests, self._tasks())

    def _tasks(self) -> dict | None:
        """The buffered groups' tasks, for engines that run multi-turn episodes or score their samples
        (None otherwise)."""
        if self.cfg.task.env == "single_turn" and self.settings.reward_placement != "colocated":
            return None
        return {g.task.id: g.task for g in self.loop.groups.values()}

    def resume(self) -> None:
        self.send([g for g in self.loop.groups.values() if g.admitted and not g.complete])

    def let_go(self, spent: list[Group]) -> None:
        """Abort a spent group's spares (tail batching: complete before all its requests finished)."""
        self.fleet.abort([r.id for g in spent for r in g.requests if r.id in self.fleet.in_engine])

    def may_launch(self) -> bool:
        """When the learner is idle, or behind one running update (so it starts the next as soon as this
        one ends) unless that one ends in an evaluation or a checkpoint, which must see the weights and the
        buffer of exactly that version."""
        if not self.learner_futures:
            return True
        return len(self.learner_futures) < UPDATES_QUEUED and not pauses_after(self.cfg, self.loop.started)

    def launch(self, taken: list[Group], dropped: list[Group], update: int) -> None:
        """Abort the spares still generating and the dropped groups' requests; send the batch."""
        self.fleet.abort(
            [r.id for g in [*taken, *dropped] for r in g.requests if r.id in self.fleet.in_engine]
        )
        bound, algo = self.loop.bound, self.cfg.algo
        batch = UpdateBatch.of(taken, update, bound, self.cfg.schedule.stale, algo)
        self.components.data.observe(
            scored_groups([g.task for g in taken], batch.samples, batch.rewards, batch.adv)
        )
        call = remote(self.backend, self.learner, LearnerWorker.update, returns=2)
        self.learner_futures.append(call(batch.learner_batch(bound.k), update))
        consumption = self.loop.consumption.metrics()
        self.batch_metrics.append({**batch.record_metrics(bound, len(self.loop.dropped)), **consumption})

    def score(self, held: list[tuple[Group, int, Sample]]) -> None:
        """Samples held for their outcome, now known: scored as samples are (`_score`), then filed."""
        self._score([s for _, _, s in held])

    def poll(self) -> Finished | None:
        """Keep the engines stepping; wait for an engine chunk or the oldest update."""
        self.loop.dirty = True
        futures = self.fleet.keep_running(self.settings.engine_chunk_steps)
        futures += [self.learner_futures[0][0]] if self.learner_futures else []
        futures += self.reward_futures
        if not futures:
            raise RuntimeError(
                f"pipeline stalled at update {self.loop.started}: nothing in the engines, no batch "
                f"ready ({len(self.loop.groups)} groups buffered)"
            )
        ready = self.backend.wait(futures, timeout=self.settings.worker_timeout_s or None)
        if not ready:
            self._stuck()
            return None
        self._collect_rewards(ready)
        self.fleet.collect(ready)
        self.fleet.rebalance()
        if not (self.learner_futures and any(f is self.learner_futures[0][0] for f in ready)):
            return None
        stats_f, self.weights = self.learner_futures.pop(0)
        return Finished(self.backend.get(stats_f), self.weights)

    def on_update(self, finished: Finished, version: int) -> None:
        stats = dict(finished.stats)
        if "behaviour_kl" in stats:
            self.loop.bound.observe(stats["behaviour_kl"])
        now, batch = time.perf_counter(), self.batch_metrics.pop(0)
        metrics = {
            **batch,
            **stats,
            "reward_errors": float(self.components.scorer.errors),
            **self.components.scorer.take_metrics(),
            **timing_metrics(batch["gen_tokens"], now - self.last_done_t, stats.pop("train_s", 0.0)),
            "engine_restarts": float(self.fleet.restarts),
            **getattr(self.components.data, "metrics", dict)(),  # what a data scheduler reports of itself
            **({"migrated": float(self.fleet.migrated - self.migrated)} if self.fleet.migrate else {}),
            **({"rewards_held": float(self.loop.held())} if self.loop.horizon else {}),
        }
        self.migrated = self.fleet.migrated
        self.last_done_t = now
        if self.cfg.task.env != "single_turn":
            metrics.update(self._episode_counts())
        self._after_update(version, metrics)

    def _episode_counts(self) -> dict[str, float]:
        """What the synchronous loop logs of its episodes, from the engine workers: per update, the prefill
        and keys-and-values counts since the last one; cumulative, the tool-call outcomes (`tool/*`),
        environment errors and the session pools' counts (`session/*`)."""
        now = self.fleet.counters()
        per_update = ("prefill_tokens", "kv_reused_tokens", "kv_evicted", "kv_expired")
        out = {k: v for k, v in now.items() if k not in per_update}
        for k in per_update:  # an engine restarted since counts from zero again: never below zero
            out[k] = max(0.0, now.get(k, 0.0) - self.episode_totals.get(k, 0.0))
        self.episode_totals = now
        return out

    def _after_update(self, done: int, metrics: dict) -> None:
        after_update(self.components, done, metrics, self.on_step, self.sync_local_weights, self.checkpoint)

    # ---- engine results ---------------------------------------------------------------------
    def _on_samples(self, samples: list[Sample]) -> None:
        groups = self.loop.groups
        # samples of a group already consumed or dropped (spares of tail batching) are let go
        samples = [s for s in samples if self.fleet.release(s.request_id) in groups]
        self._score(samples)

    def _score(self, samples: list[Sample]) -> None:
        """Score what needs a reward here or on the reward worker, then file every sample."""
        groups, scorer = self.loop.groups, self.components.scorer
        # an episode comes scored by its environment, a sample by its engine worker where rewards are
        # colocated; everything else is scored here, or by the reward worker (`pipeline.reward_placement`),
        # except a sample whose outcome is not known yet: the loop holds it
        todo = [s for s in samples if needs_reward(s) and not self.loop.holds(groups[group_of(s)])]
        if todo:
            tasks = {t.id: t for t in (groups[group_of(s)].task for s in todo)}
            if self.reward_worker is not None:
                call = remote(self.backend, self.reward_worker, RewardWorker.score)
                self.reward_futures.append(call(tasks, todo))
                sent = {s.request_id for s in todo}
                samples = [s for s in samples if s.request_id not in sent]
            else:
                scored = {s.request_id: s for s in scorer.score(tasks, todo)}
                samples = [scored.get(s.request_id, s) for s in samples]
        scorer.account([s for s in samples if s.reward_metrics is not None])  # scored here or in an engine
        self._file(samples)

    def _file(self, samples: list[Sample]) -> None:
        """Each sample to its group: a cut one as its partial, a scored one as finished (a sample whose
        group has gone while it was scored is let go)."""
        groups = self.loop.groups
        for s in samples:
            g = groups.get(group_of(s))
            if g is None:
                continue
            if s.finish_reason == "aborted":
                g.partial[s.sample_index] = s
            else:
                self.loop.finish(g, s.sample_index, s)

    def _collect_rewards(self, ready: list) -> None:
        """The reward worker's answers among `ready`, in the order they were asked: counted, filed."""
        done = [f for f in self.reward_futures if any(f is r for r in ready)]
        for f in done:
            self.reward_futures.remove(f)
            scored = self.backend.get(f)
            self.components.scorer.account(scored)
            self._file(scored)

    def _on_moved(self, index: int, samples: list[Sample]) -> None:
        """Samples cut for a migration (filed in their groups' `partial`) resume on engine `index`."""
        groups = self.loop.groups
        moved = [
            groups[group_of(s)].resume(s.sample_index)
            for s in samples
            if group_of(s) in groups and s.sample_index in groups[group_of(s)].partial
        ]
        if moved:
            self.fleet.send(moved, self._tasks(), to=index)

    def _on_restart(self, index: int, group_ids: set[str]) -> None:
        """Engine `index` was replaced: send every request of the groups it held that is not in an engine."""
        self.send([self.loop.groups[gid] for gid in group_ids])

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

    def sync_local_weights(self) -> None:
        """Load the latest weights into this process's model and engine (evaluation)."""
        w = self.backend.get(self.weights) if not isinstance(self.weights, dict) else self.weights
        model = self.components.model
        engine: Any = self.components.engine
        if not isinstance(w, WeightPush):
            model.load_state_dict(w)
            engine.update_weights(w, self.loop.version)
            return
        if w.adapters is not None:  # LoRA: this model holds the base; merged into its adapted weights
            self.adapter_base.merge_into(w.adapters, model.state_dict())
        else:
            result = model.load_state_dict(w.weights, strict=False)  # a tied weight comes once
            if result.unexpected_keys or set(result.missing_keys) - tied_names(model):
                raise ValueError(f"a weight push does not fit this model: {result}")
        receive(engine, w, self.loop.version, "evaluation engine", self.cfg.pipeline.verify_pushes)

    def checkpoint(self, done: int) -> None:
        """Cut the engines so the buffer holds every unconsumed sample, save, then resume generation."""
        self.fleet.cut()
        self.fleet.flush()
        self.write_timeline()
        self.components.state["pipeline"] = {**self.loop.state_dict(), "engine_restarts": self.fleet.restarts}
        self.components.state["data"] = self.components.data.state_dict()
        self.components.logger.sync()
        save = remote(self.backend, self.learner, LearnerWorker.save_checkpoint)
        self.backend.get(save(done, self.components.state))
        if done < self.cfg.steps:
            self.resume()

    def write_timeline(self) -> None:
        spans = self.fleet.spans()
        with contextlib.suppress(WorkerDiedError):
            spans += self.backend.get(remote(self.backend, self.learner, LearnerWorker.spans)())
            if self.reward_worker is not None:
                spans += self.backend.get(remote(self.backend, self.reward_worker, RewardWorker.spans)())
        write_spans(self.components.run.root, sorted(spans, key=lambda s: s.start))


def run_pipeline(c: Components, on_step: StepCallback | None = None) -> None:
    """Train `c` from its current step to `cfg.steps` with the asynchronous pipeline."""
    p = c.cfg.pipeline
    backend = make_backend(
        p.backend,
        address=p.ray_address,
        num_engines=p.num_engines,
        engine_cpus=p.engine_cpus,
        learner_cpus=p.learner_cpus,
        learner_ranks=c.cfg.learner.ranks if c.cfg.learner.parallel != "none" else 1,
        reward_cpus=p.reward_cpus if p.reward_placement == "separate" else 0.0,
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
                try:  # a learner on several ranks stops their processes
                    pipe.backend.get(remote(pipe.backend, pipe.learner, LearnerWorker.close)())
                except Exception as err:
                    log.warning("could not close the learner: %s", err)
    finally:
        backend.shutdown(wait=not stuck)
