"""The training loop on a virtual clock: `ClusterSim` is the `Loop`'s cluster for a scenario.

The loop is the one a training run uses (`schedrl.orchestrate.loop`): admission under the staleness
bound, the purge, the consumption policy's take and the weight-sync policy are the same code, under a
training run's own `Schedule`. What is simulated here: the engines (`SimEngine`, a group to the one
holding the fewest requests, `sim.fleet`), the learner's cost, tool calls with their waits, and long-tail
migration. A group's lengths are drawn from the workload when it is issued.

Events come from a heap: each engine's next finish (invalidated when the engine changes), the learner's
next update and the next tool answer; `poll` takes the earliest. A weight sync pauses an engine for
`SyncCost.sync_s`; colocated placement adds `cluster.switch_s` each way around every update, on the
learner's clock.
"""

from __future__ import annotations

import heapq
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schedrl.engine.admission import FCFS
from schedrl.orchestrate.buffer import Group
from schedrl.orchestrate.loop import Finished, Loop
from schedrl.rollout.ordering import LengthOrdered
from schedrl.rollout.predictors import LengthPredictor
from schedrl.rollout.tool_wait import TOOL_WAITS, Back, Turn
from schedrl.sim.engine import Job, SimEngine
from schedrl.sim.fleet import SimFleet
from schedrl.sim.scenario import Scenario
from schedrl.timeline import Span


class GivenPrediction(LengthPredictor):
    """The job's own predicted length (its true length off by the scenario's predictor error)."""

    name = "given"

    def predict(self, request: Any) -> float:
        return float(request.predicted)


@dataclass
class SimResult:
    scenario: str
    step_s: list[float]  # wall time of each update (from the previous update's end)
    mean_step_s: float  # over the steps after warm-up
    steps_per_s: float
    engine_busy_frac: float  # of engine-seconds, over the run
    learner_busy_frac: float
    tokens: int  # generated, over the run
    rollout_tokens_per_s: float  # generated tokens per second of rollout (colocated: not training)
    dropped: int  # samples too stale to train on
    mean_staleness: float  # of trained samples: update - oldest token's version
    makespan_s: float
    spans: list[Span]
    gen_s: list[float]  # per update: from its batch's first admission to its last sample
    k_trace: list[int] = field(default_factory=list)  # the staleness bound after each update

    def summary(self) -> dict:
        return {
            "scenario": self.scenario,
            "mean_step_s": round(self.mean_step_s, 4),
            "steps_per_s": round(self.steps_per_s, 6),
            "engine_busy_frac": round(self.engine_busy_frac, 4),
            "learner_busy_frac": round(self.learner_busy_frac, 4),
            "tokens": self.tokens,
            "rollout_tokens_per_s": round(self.rollout_tokens_per_s, 3),
            "dropped": self.dropped,
            "mean_staleness": round(self.mean_staleness, 3),
            "makespan_s": round(self.makespan_s, 3),
            "final_k": self.k_trace[-1] if self.k_trace else None,
        }


class ClusterSim:
    """The virtual clock: the `Loop`'s cluster for a scenario."""

    def __init__(self, s: Scenario) -> None:
        self.s = s
        sch = s.schedule
        self.rng = np.random.default_rng(s.seed)
        cost = s.engine_cost()
        budget, parks = s.engine.max_batched_tokens or (1 << 30), s.workload.park_slots
        engines = [SimEngine(i, cost, self._admission(), 0, budget, parks) for i in range(s.num_engines)]
        self.fleet = SimFleet(engines, s.sync.sync_s(s.weight_bytes))
        c = s.cluster
        self.overlap = c.placement == "disaggregated" and c.interference == "overlap"
        self.learner_windows: list[tuple[float, float]] = []  # the updates' (start, end): engines slow there
        if self.overlap:
            for e in engines:
                e.slow_factor, e.slow_windows = c.engine_interference, self.learner_windows
        self.prompts = s.workload.prompts_per_step // s.updates_per_step  # per update
        self.loop = Loop(sch, self.prompts * s.workload.group_size, s.steps * s.updates_per_step, self)
        self.long_rounds: list[int] = []  # tail batching: the waves that were long rounds
        self.k_trace: list[int] = []  # k after each update (moves only under auto)
        self.learner_free_at = 0.0
        self.learner_busy = 0.0
        self.pending: list[float] = []  # end times of launched updates
        self.update_ends: list[float] = []
        self.staleness: list[int] = []
        self.tokens_trained = 0
        self.spans: list[Span] = []
        self.first_admit: dict[int, float] = {}
        self.gen_s: list[float] = []
        self.colocated = s.cluster.placement == "colocated"
        self.switch = s.cluster.switch_s if self.colocated else 0.0
        self.tool_returns: list[tuple[float, int, Job]] = []  # (time, seq, job) of samples on a tool call
        self.tool_calls = 0
        self.tool_wait: Any = TOOL_WAITS.build(sch.tool_wait, sch.tool_wait_args)
        self.held: list[Job] = []  # lockstep: answers held until no sample is generating
        self.migrated = 0  # requests moved between engines (long-tail migration)
        self.heap: list[tuple[float, int, int]] = []  # (time, epoch, engine) of each engine's next finish
        self.epoch = [0] * len(engines)
        self.events = 0
        self.turns_seen = 0
        self.refresh: tuple[str, int | None] = ("all", None)  # engines to look up before the next event
        self.syncs_before = 0

    @property
    def consumption(self) -> Any:
        return self.loop.consumption

    def _admission(self):
        name = self.s.schedule.admission
        if name == "fcfs":
            return FCFS()  # the engine's own default
        return LengthOrdered(name, GivenPrediction())

    def run(self) -> SimResult:
        self.loop.run()
        return self._result()

    # ---- the loop's cluster ---------------------------------------------------------------------------
    def _draw(self, prompts: int, responses: int) -> list[np.ndarray]:
        """Per prompt, a (responses, 2) array: each response's true and predicted length."""
        wl = self.s.workload
        lengths = wl.lengths.sample(self.rng, prompts, responses)
        noise = (
            np.exp(self.rng.normal(0.0, wl.predictor_sigma, lengths.shape))
            if wl.predictor_sigma > 0
            else np.ones(lengths.shape)
        )
        return list(np.stack([lengths, lengths * noise], axis=-1))

    def issue(self, wave: int, consumption: Any) -> list[Group] | None:
        """Each prompt's lengths are drawn for every response the policy may run (tail batching's
        spares); a deferred prompt keeps them (its long round runs the first), where the real one is
        sampled again under newer weights. A group's task is its lengths."""
        wl = self.s.workload
        most = consumption.max_requests(wl.group_size)
        plan = consumption.plan(
            lambda samples: [(row, wl.group_size) for row in self._draw(samples // wl.group_size, most)], wave
        )
        if plan is None:
            return None
        out = []
        for g, (row, n, need) in enumerate(plan):
            group = Group(f"w{wave}g{g}", row, [], wave=wave, need=0 if need == n else need)
            group.requests = [
                Job(f"w{wave}g{g}s{i}", group, i, wl.prompt_tokens, int(true), float(pred), turns=wl.turns)
                for i, (true, pred) in enumerate(row[:n])
            ]
            out.append(group)
        return out

    def send(self, groups: list[Group]) -> None:
        for g in groups:
            self.first_admit.setdefault(g.wave, self.fleet.now)
        self.fleet.send(
            [j for g in groups for j in g.requests if j.sample_index not in g.done],
            self.s.schedule.divide_groups,
        )

    def resume(self) -> None:
        """The cut requests back to the engines, to resume from their prefix; colocated, ahead of fresh
        ones (APRIL resumes the buffered partial rollouts first)."""
        jobs, self.fleet.cut_jobs = self.fleet.cut_jobs, []
        if jobs:
            self.fleet.send(jobs, self.s.schedule.divide_groups, front=self.colocated)

    def let_go(self, spent: list[Group]) -> None:
        """A spent group's unfinished jobs run on: the simulated engines cannot abort one request."""

    def may_launch(self) -> bool:
        return not self.pending

    def _end_round(self, taken: list[Group], dropped: list[Group]) -> None:
        """After a take: when it left spares or dropped groups (tail batching defers them), every response
        still running is aborted (its tokens are lost: a deferred prompt runs again in a long round). The
        pipeline aborts those requests alone; here they are all that runs, since a policy with spares
        plans its next batch only after a take."""
        if self.loop.consumption.metrics().get("tail_long_round"):
            self.long_rounds.append(taken[0].wave)
        if not dropped and all(g.needed == len(g.requests) for g in taken):
            return
        for e in self.fleet.engines:
            self._finish(e.advance(self.fleet.now))
        self.fleet.cut()
        self.fleet.cut_jobs = []

    def launch(self, taken: list[Group], dropped: list[Group], update: int) -> None:
        self._end_round(taken, dropped)
        tokens, ages = 0, []
        for g in taken:
            for job in g.done.values():  # the first `needed` to finish
                tokens += job.prompt + job.length
                self.staleness.append(update - (job.v_min or 0))
                ages.append(update - ((job.v_min or 0) + (job.v_max or 0)) / 2)
        self.tokens_trained += tokens
        # the mismatch AutoStaleness follows: drift_kl per version, at the batch's mean token age
        self.loop.bound.observe(self.s.workload.drift_kl * (statistics.fmean(ages) if ages else 0.0))
        self.k_trace.append(self.loop.bound.k)
        if (update + 1) % self.s.updates_per_step == 0:  # a step's generation: its first admission to now
            first = update + 1 - self.s.updates_per_step
            self.gen_s.append(self.fleet.now - self.first_admit.get(first, self.fleet.now))
        start = max(self.fleet.now, self.learner_free_at)
        if self.colocated:  # the learner takes the devices: unfinished requests are cut, kept, resumed after
            for e in self.fleet.engines:  # each engine ends its step first (what finishes there stays done)
                self._finish(e.advance(self.fleet.now))
                start = max(start, e.clock)
            self.fleet.cut()
        c = self.s.cluster
        slow = c.learner_interference if c.placement == "disaggregated" else 1.0
        if self.overlap and self.fleet.in_flight == 0:  # no engine works beside this update
            slow = 1.0
        train = self.s.learner.train_s(tokens, self.s.learner_gpus) * slow + 2 * self.switch
        end = start + train
        self.spans.append(Span("learner", "train", start, end))
        if self.overlap:
            oldest = min(e.clock for e in self.fleet.engines)
            self.learner_windows[:] = [w for w in self.learner_windows if w[1] > oldest] + [(start, end)]
        if self.colocated:
            for e in self.fleet.engines:
                e.hold(start, end)
        self.learner_busy += train
        self.learner_free_at = end
        self.pending.append(end)

    def on_update(self, finished: Finished, version: int) -> None:
        self.update_ends.append(self.fleet.now)
        if self.colocated:
            self.resume()

    def score(self, held: list[tuple[Group, int, Job]]) -> None:
        """The virtual clock's groups resolve at once (`Group.resolves` is -1): nothing is ever held."""
        raise AssertionError(f"the simulator holds no samples for their rewards, got {len(held)}")

    # ---- samples ---------------------------------------------------------------------------------------
    def _finish(self, jobs: list[Job]) -> None:
        self.fleet.in_flight -= len(jobs)
        for job in jobs:
            if job.generated < job.length:  # a turn ended in a tool call: back when the tool answers
                self._call_tool(job)
                continue
            g = job.group
            if isinstance(g, Group) and g.id in self.loop.groups:
                self.loop.finish(g, job.sample_index, job)

    def _call_tool(self, job: Job) -> None:
        wl = self.s.workload
        job.waited_from = self.fleet.now
        turn = Turn(job.id, job.turn - 1, job.turns, job.prompt + job.generated)
        keep = self.tool_wait.keep_s(turn)
        if keep > 0:
            self.fleet.engines[job.engine].park(job, self.fleet.now + keep)
        wait = (
            wl.tool_wait_s * math.exp(self.rng.normal(0.0, wl.tool_wait_sigma))
            if wl.tool_wait_sigma
            else wl.tool_wait_s
        )
        heapq.heappush(self.tool_returns, (self.fleet.now + wait, self.tool_calls, job))
        self.tool_calls += 1

    def _tool_answers(self) -> None:
        """The earliest tool answer. It is handed on when its engine's step ends (as the pipeline's loop
        does), and the wait the policy observes runs to then: the sample queues on that engine if its
        keys and values are still parked there (prefilling only what is new if they last until it is
        admitted), else on the least-loaded one, history prefilled."""
        now, _, job = heapq.heappop(self.tool_returns)
        self.fleet.now = now
        engine = self.fleet.engines[job.engine]
        self._finish(engine.advance(now))
        at = max(now, engine.clock)
        history = job.prompt + job.generated
        back = Back(job.id, job.turn, job.turns, history, at - job.waited_from)
        self.tool_wait.observe(back)
        kept = engine.parked_at(job, at)
        job.cached = history if kept else 0
        job.prompt += self.s.workload.tool_tokens
        job.priority = self.tool_wait.priority(back)
        group = job.group
        if not (isinstance(group, Group) and group.id in self.loop.groups):
            return
        if self.tool_wait.lockstep:
            self.held.append(job)
        else:
            self.fleet.send([job], divide=True, to=job.engine if kept else None)

    def _release_held(self) -> None:
        """Lockstep: every sample is waiting on a tool or done, and every tool has answered."""
        jobs, self.held = self.held, []
        self.fleet.send(jobs, divide=True)
        self._finish(self.fleet.finished)
        self.fleet.finished = []

    def _migrate(self, dst: SimEngine) -> None:
        """Long-tail migration: `dst` ran dry; it takes half the requests of the engine holding the most.
        Simplified from JigsawRL, which moves the keys and values and plans moves with a look-ahead over
        its sub-stage graph: here a moved running request re-prefills its context, and the rule is greedy."""
        src = max(self.fleet.engines, key=lambda e: (e.held, -e.index))
        if src is dst or src.held < 2:
            return
        self._finish(src.advance(self.fleet.now))
        jobs = src.take(src.held // 2)
        if jobs:
            self._finish(dst.advance(self.fleet.now))
            dst.submit(jobs)
            self.migrated += len(jobs)
            self.fleet.touched |= {src.index, dst.index}

    # ---- the clock -------------------------------------------------------------------------------------
    def _look_up(self, engines: Any) -> None:
        """Push the next finish of each of `engines` (older entries of theirs go stale)."""
        for i in engines:
            self.epoch[i] += 1
            t = self.fleet.engines[i].next_finish()
            if t is not None:
                heapq.heappush(self.heap, (t, self.epoch[i], i))

    def _settle(self) -> None:
        """Before the next event: jobs that finished while a turn sent work are handed on, and the
        engines that changed since the last event have their next finish looked up."""
        if self.loop.turns != self.turns_seen:
            self.turns_seen = self.loop.turns
            self._finish(self.fleet.finished)
            self.fleet.finished = []
        kind, e = self.refresh
        if kind == "all" or (kind == "engine" and self.fleet.syncs != self.syncs_before):
            self._look_up(range(len(self.fleet.engines)))
        else:
            self._look_up(self.fleet.touched | ({e} if e is not None else set()))
        self.fleet.touched = set()
        if self.held and self.fleet.in_flight == 0 and not self.tool_returns:
            self._release_held()
            self._look_up(self.fleet.touched)
            self.fleet.touched = set()

    def poll(self) -> Finished | None:
        """The next event: a tool's answer, an update's end (every engine first runs to then) or an
        engine's next finish (an engine left with nothing may take half of the busiest one's work)."""
        self._settle()
        self.events += 1
        if self.events > 50_000_000:
            raise RuntimeError("simulation did not finish (event budget spent)")
        heap, epoch = self.heap, self.epoch
        while heap and heap[0][1] != epoch[heap[0][2]]:
            heapq.heappop(heap)
        t_engine = heap[0][0] if heap else math.inf
        t_learner = self.pending[0] if self.pending else math.inf
        t_tool = self.tool_returns[0][0] if self.tool_returns else math.inf
        if t_tool < min(t_engine, t_learner):
            self._tool_answers()
            self.refresh = ("touched", None)
            return None
        if math.isinf(t_engine) and math.isinf(t_learner):
            raise RuntimeError(
                f"simulation stalled at update {self.loop.started}: nothing running, no batch ready "
                f"({len(self.loop.groups)} groups buffered)"
            )
        if t_learner <= t_engine:
            self.fleet.now = self.pending.pop(0)
            for e in self.fleet.engines:
                self._finish(e.advance(self.fleet.now))
            self.refresh = ("all", None)
            return Finished({})
        _, _, idx = heapq.heappop(heap)
        e = self.fleet.engines[idx]
        self.fleet.now = t_engine
        self._finish(e.advance(t_engine))
        if self.s.schedule.migrate and e.held == 0:
            self._migrate(e)
        self.syncs_before = self.fleet.syncs
        self.refresh = ("engine", idx)
        if self.fleet.staged is not None and self.fleet.idle:
            self.loop.dirty = True
        return None

    def _result(self) -> SimResult:
        ups = self.s.updates_per_step
        ends = self.update_ends[ups - 1 :: ups]  # a step ends with its last update
        steps = [b - a for a, b in zip([0.0, *ends[:-1]], ends, strict=True)]
        tail = steps[self.s.warmup_steps :]
        mean = statistics.fmean(tail)
        makespan = ends[-1]
        engines = self.fleet.engines
        spans = [sp for e in engines for sp in e.spans] + self.spans
        return SimResult(
            scenario=self.s.name,
            step_s=steps,
            mean_step_s=mean,
            steps_per_s=1.0 / mean if mean > 0 else math.inf,
            engine_busy_frac=sum(e.busy_s for e in engines) / (len(engines) * makespan),
            learner_busy_frac=self.learner_busy / makespan,
            tokens=sum(e.tokens for e in engines),
            rollout_tokens_per_s=sum(e.tokens for e in engines)
            / max(1e-12, makespan - statistics.fmean(e.held_s for e in engines)),
            dropped=len(self.loop.dropped),
            mean_staleness=statistics.fmean(self.staleness) if self.staleness else 0.0,
            makespan_s=makespan,
            spans=spans,
            gen_s=self.gen_s,
            k_trace=self.k_trace,
        )


def simulate(s: Scenario) -> SimResult:
    """Run scenario `s` for `s.steps` updates."""
    return ClusterSim(s).run()
