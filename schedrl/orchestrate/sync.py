"""The synchronous loop: `StepCluster` is the `Loop`'s cluster in one process with no threads: the schedule's defaults (k = 0,
`wave`, `drain`) make it the on-policy reference every asynchronous mode must match (tasks -> G samples
each -> rewards -> advantages -> update -> weights to the engine).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from schedrl.data import scored_groups
from schedrl.distributed import WorkerStuckError
from schedrl.distributed.workers import train_step
from schedrl.envs import Task
from schedrl.envs.scoring import reward_delay
from schedrl.orchestrate.after_update import StepCallback, after_update
from schedrl.orchestrate.buffer import Group
from schedrl.orchestrate.build import Components
from schedrl.orchestrate.loop import Finished, Loop
from schedrl.orchestrate.pipeline import issue_groups
from schedrl.orchestrate.step_metrics import timing_metrics
from schedrl.orchestrate.update_batch import UpdateBatch
from schedrl.orchestrate.watchdog import Watchdog
from schedrl.rewards.judge import policy_judges
from schedrl.timeline import Recorder, write_spans
from schedrl.training.checkpoint import save_checkpoint
from schedrl.types import Request, Sample, group_of

log = logging.getLogger(__name__)


class LocalFleet:
    """This process's engine as the weight-sync policies see it. Sent requests wait here until the next
    poll runs them all to the end, so between two polls the engine itself holds nothing."""

    def __init__(self, engine: Any, version: int) -> None:
        self.engine, self.version = engine, version
        self.staged: tuple[Any, int] | None = None
        self.queued: list[Request] = []

    @property
    def idle(self) -> bool:
        return not self.queued

    def send(self, requests: list[Request]) -> None:
        self.queued += requests

    def cut(self) -> None:
        """Nothing is running between two polls: there is nothing to cut."""

    def push(self, weights: Any, version: int, skip: int | None = None) -> None:
        self.engine.update_weights(weights, version)
        self.version = version

    def stage(self, weights: Any, version: int) -> None:
        self.staged = (weights, version)

    def flush(self, skip: int | None = None) -> None:
        if self.staged is not None:
            self.push(*self.staged)
            self.staged = None


class StepCluster:
    """The synchronous loop: the `Loop`'s cluster in one process with no threads. A poll generates every
    admitted request to the end in the schedule's rollout mode (plain, pruning, speculative:
    `StepRollout`), or, with nothing to generate, runs the update the loop launched on this process's
    learner. Under the schedule's defaults (k = 0, `wave`, `drain`) that is: generate a step's batch,
    train on it, push the weights. `watchdog` names a phase that runs past `pipeline.worker_timeout_s`."""

    def __init__(self, c: Components, on_step: StepCallback | None, watchdog: Watchdog) -> None:
        cfg, start = c.cfg, c.start_step or 0
        self.c, self.on_step, self.watchdog = c, on_step, watchdog
        budget = cfg.sampling.prompts_per_step * cfg.sampling.group_size
        self.loop = Loop(cfg.schedule, budget, cfg.steps, self, start, reward_delay(c.source))
        if "pipeline" in c.state:
            self.loop.load_state_dict(c.state["pipeline"])
        else:  # a checkpoint of a run without the loop's books: batch s trains update s
            self.loop.next_wave = start
        self.fleet = LocalFleet(c.engine, start)
        self.launched: tuple[UpdateBatch, int] | None = None
        self.timeline = Recorder("trainer")
        episodes = getattr(c.rollout, "episodes", None)
        if episodes is not None and cfg.logging.episode_trace:  # the episodes' spans join the trainer's
            episodes.timeline = self.timeline
        self.rollout_stats: dict[str, float] = {}
        self.gen_s, self.started_t = 0.0, time.perf_counter()

    def issue(self, wave: int, consumption: Any) -> list[Group] | None:
        return issue_groups(self.c, wave, consumption)

    def send(self, groups: list[Group]) -> None:
        self.fleet.send([r for g in groups for r in g.to_send()])

    def resume(self) -> None:
        """Nothing is ever cut: a poll runs every request it takes to the end."""

    def let_go(self, spent: list[Group]) -> None:
        """A spent group's requests have all finished: a poll runs every request to the end."""

    def may_launch(self) -> bool:
        return self.launched is None

    def launch(self, taken: list[Group], dropped: list[Group], update: int) -> None:
        batch = UpdateBatch.of(taken, update, self.loop.bound, self.c.cfg.schedule.stale, self.c.cfg.algo)
        self.c.data.observe(scored_groups([g.task for g in taken], batch.samples, batch.rewards, batch.adv))
        self.launched = (batch, update)

    def poll(self) -> Finished | None:
        if self.fleet.queued:
            self._generate()
            return None
        if self.launched is None:
            raise RuntimeError(f"the synchronous loop stalled at update {self.loop.started}: no batch ready")
        batch, update = self.launched
        self.launched = None
        t0, bound = time.perf_counter(), self.loop.bound
        with self.watchdog.phase("learner", f"update of step {update + 1}"), self.timeline.span("train"):
            stats = train_step(
                self.c.learner, self.c.tokenizer.pad_token_id, batch.learner_batch(bound.k), update
            )
        stats["train_s"] = time.perf_counter() - t0
        return Finished(
            {**batch.record_metrics(bound, len(self.loop.dropped)), **stats}, self.c.model.state_dict()
        )

    def _generate(self) -> None:
        """Every queued request to the end; each sample to its group (a group that came back smaller,
        pruned or with failed episodes, is complete with what it has)."""
        requests, self.fleet.queued = self.fleet.queued, []
        groups = self.loop.groups
        tasks = {g.task.id: g.task for g in groups.values()}
        if self.c.rollout is None:
            raise ValueError("the synchronous loop needs Components.rollout (`build` sets it)")
        t0, what = time.perf_counter(), f"generation and scoring of step {self.loop.started + 1}"
        with self.watchdog.phase("engine", what), self.timeline.span("generate"):
            samples, self.rollout_stats = self.c.rollout.run(
                requests, lambda ss: self._rewards(tasks, ss), tasks
            )
        self.gen_s += time.perf_counter() - t0
        returned: dict[str, int] = {}
        for smp in samples:
            returned[group_of(smp)] = returned.get(group_of(smp), 0) + 1
        for gid in {group_of(r) for r in requests}:
            n = returned.get(gid, 0)
            if n == 0:  # every episode of it failed at reset
                self.loop.abandoned += len(groups.pop(gid).requests)
            elif n < len(groups[gid].requests):
                groups[gid].need = n
        for smp in samples:
            self.loop.finish(groups[group_of(smp)], smp.sample_index, smp)

    def _rewards(self, tasks: dict[str, Task], samples: Sequence[Sample]) -> list[float | None]:
        """The reward of each sample; None for one whose outcome is not known yet (the loop holds it)."""
        now = [s for s in samples if not self.loop.holds(self.loop.groups[group_of(s)])]
        rewards = (
            dict(zip([s.request_id for s in now], self.c.scorer(tasks, now), strict=True)) if now else {}
        )
        return [rewards.get(s.request_id) for s in samples]

    def score(self, held: list[tuple[Group, int, Sample]]) -> None:
        """Samples held for their outcome, now known: scored, then finished."""
        samples = [s for _, _, s in held]
        rewards = self.c.scorer({g.task.id: g.task for g, _, _ in held}, samples)
        for (g, i, _), s, r in zip(held, samples, rewards, strict=True):
            self.loop.finish(g, i, s.with_reward(r))

    def on_update(self, finished: Finished, version: int) -> None:
        c, now = self.c, time.perf_counter()
        stats = dict(finished.stats)
        metrics = {
            **stats,
            **self.loop.consumption.metrics(),
            **getattr(c.data, "metrics", dict)(),  # what a data scheduler reports of itself
            **self.rollout_stats,
            "reward_errors": float(c.scorer.errors),
            **c.scorer.take_metrics(),
            "gen_s": self.gen_s,
            **({"rewards_held": float(self.loop.held())} if self.loop.horizon else {}),
            **timing_metrics(stats["gen_tokens"], now - self.started_t, stats.pop("train_s", 0.0)),
        }
        if version == 1 and metrics["reward_mean"] < c.cfg.min_start_reward:
            log.warning(
                "RL starts at mean reward %.3f < min_start_reward=%.3f: GRPO from a start this weak "
                "tends to collapse onto one constant answer; train longer with SFT (sft.steps) or "
                "pick an easier task",
                metrics["reward_mean"],
                c.cfg.min_start_reward,
            )
        # the engine already holds the newest weights: the weight-sync policy pushed them
        after_update(c, version, metrics, self.on_step, load_latest=lambda: None, save=self.checkpoint)
        self.gen_s, self.started_t = 0.0, time.perf_counter()  # a step's time leaves out its logging

    def checkpoint(self, done: int) -> None:
        write_spans(self.c.run.root, self.timeline.drain())
        self.c.state["pipeline"] = self.loop.state_dict()
        checkpoint(self.c, done)


def checkpoint(c: Components, step: int) -> None:
    c.logger.sync()
    c.state["data"] = c.data.state_dict()
    save_checkpoint(
        c.run.ckpt_dir, step, c.model, c.tokenizer, c.learner.state_dict(), c.state, keep_last=c.cfg.keep_last
    )


def run_sync(c: Components, on_step: StepCallback | None = None) -> None:
    """Train `c` from its current step to `cfg.steps` with the synchronous loop (`StepCluster`)."""
    watchdog = Watchdog(c.cfg.pipeline.worker_timeout_s)
    for judge in policy_judges(c.source):  # `judge: policy`: the policy's engine is this process's
        judge.bind_policy(c.engine)
    try:
        StepCluster(c, on_step, watchdog).loop.run()
    except KeyboardInterrupt:
        if watchdog.fired is None:
            raise
        raise WorkerStuckError(watchdog.fired) from None  # the interrupt landed just after its phase
    finally:
        watchdog.close()
