"""The engine's own admission as an RL environment: which waiting request enters the running batch next.

A simulated continuous-batching engine with `slots` places runs a workload of requests (prompt
length, true output length, predicted output length). Whenever a place is free and requests wait,
the agent picks one of them (the first `max_waiting` in arrival order are offered); then the
engine steps until the next such decision. A step costs what `StepCost` says for its work, the
`StepStats` the built-in engine reports: a fixed part, a part per running row, per prefilled token
and per key attended. `StepCost.fit` calibrates it by least squares from real engine steps
(`measure_steps`), so a policy trained here fast can be evaluated on the real engine.

Reward: minus the simulated seconds of each stretch of steps, divided by FCFS's makespan on the
same workload, so an episode returns -makespan / FCFS makespan (-1: as good as FCFS).

The observation (`admission_features`) holds only what an engine knows at admission time: the
offered requests' predicted lengths and prompts, their arrival order, and the running batch's size
and predicted remainders. So a policy trained here runs inside the real engine unchanged
(`schedrl.rollout.learned.LearnedAdmission`, `schedule.admission: learned`); the features live in core
(`schedrl.rollout.admission_features`), which both import.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from schedrl.engine.base import StepStats
from schedrl.envs.scheduling.jobshop_env import AllowedJobs
from schedrl.rollout.admission_features import FEATURES, admission_features

TEACHERS = ("fcfs", "lpt", "spt")  # heuristics `AdmissionEnv.teacher_action` plays (behaviour cloning)


def teacher_choice(name: str, predicted: Sequence[float]) -> int:
    """The position a heuristic admits among `predicted` (ties: the earliest arrival)."""
    if name == "fcfs":
        return 0
    if name == "lpt":
        return int(np.argmax(predicted))
    if name == "spt":
        return int(np.argmin(predicted))
    raise ValueError(f"unknown admission teacher {name!r}; valid: {', '.join(TEACHERS)}")


@dataclass(frozen=True)
class StepCost:
    """Seconds of one engine step: base + per_row x rows + per_prefill x prefill tokens + per_context x keys."""

    base: float = 1.0
    per_row: float = 0.0
    per_prefill: float = 0.0
    per_context: float = 0.0

    def seconds(self, s: StepStats) -> float:
        rows = s.decode_rows
        return (
            self.base
            + self.per_row * rows
            + self.per_prefill * s.prefill_tokens
            + self.per_context * s.context_tokens
        )

    @classmethod
    def fit(cls, records: Sequence[tuple[StepStats, float]]) -> StepCost:
        """Least squares over (stats, seconds) records; negative coefficients are dropped and the rest refit."""
        if len(records) < 4:
            raise ValueError(f"StepCost.fit needs at least 4 steps, got {len(records)}")
        x = np.array([[1.0, s.decode_rows, s.prefill_tokens, s.context_tokens] for s, _ in records])
        y = np.array([t for _, t in records])
        keep = np.ones(4, dtype=bool)
        coef = np.zeros(4)
        for _ in range(4):
            coef = np.zeros(4)
            coef[keep] = np.linalg.lstsq(x[:, keep], y, rcond=None)[0]
            if (coef >= 0).all():
                break
            keep &= coef > 0
        return cls(*np.maximum(coef, 0.0).tolist())


def measure_steps(engine, requests) -> list[tuple[StepStats, float]]:
    """Run `requests` on a `ParkingEngine` (the built-in one) and record each step's work and seconds."""
    for r in requests:
        engine.add(r)
    records = []
    while engine.has_unfinished():
        start = time.perf_counter()
        engine.step()
        records.append((engine.last_step, time.perf_counter() - start))
    return records


@dataclass(frozen=True)
class Job:
    prompt: int  # prompt tokens (a later turn: the whole history so far, prefilled again)
    length: int  # output tokens it will generate
    predicted: float  # what a length predictor says
    follows: int = -1  # a multi-turn episode's later turn: the job whose end it waits on (-1: none)
    wait_s: float = 0.0  # ... and the tool's seconds between that end and its arrival


def simulate(jobs: Sequence[Job], slots: int, cost: StepCost, choose: Callable[[list[int]], int]) -> float:
    """The makespan of `jobs` when `choose(waiting ids) -> position` picks each admission."""
    env = AdmissionEnv(lambda rng: list(jobs), slots, cost, max_waiting=len(jobs), normalize=False)
    env.reset(seed=0)
    total, done = 0.0, env.finished
    while not done:
        _, r, done, _, _ = env.step(choose(list(env.offered)))
        total -= r
    return total


class AdmissionEnv(gym.Env):
    """`workloads(rng) -> list[Job]` at every reset; `slots` running places; `cost` prices each step."""

    metadata = {"render_modes": []}

    def __init__(
        self,
        workloads: Callable[[np.random.Generator], list[Job]],
        slots: int,
        cost: StepCost,
        max_waiting: int = 64,
        normalize: bool = True,
    ) -> None:
        self.workloads, self.slots, self.cost = workloads, slots, cost
        self.max_waiting, self.normalize = max_waiting, normalize
        self.observation_space = gym.spaces.Box(-1e6, 1e6, (max_waiting, FEATURES), np.float32)
        self.action_space = AllowedJobs(max_waiting, self)
        self.inst: list[Job] | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        jobs = self.workloads(self.np_random)
        if not jobs:
            raise ValueError("AdmissionEnv: the workload has no request")
        self.inst = jobs
        self.norm = 1.0
        if self.normalize:
            self.norm = simulate(jobs, self.slots, self.cost, lambda waiting: 0)  # FCFS
        self.after: dict[int, list[int]] = {}  # job -> the turns that arrive once it ends
        for k, j in enumerate(jobs):
            if j.follows >= 0:
                self.after.setdefault(j.follows, []).append(k)
        self.waiting = [k for k, j in enumerate(jobs) if j.follows < 0]
        self.pending: list[tuple[float, int]] = []  # (arrival time, job): turns waiting on a tool
        self.running: dict[int, int] = {}  # job -> tokens generated
        self.fresh: list[int] = []  # admitted since the last step: they prefill in the next one
        self.clock, self.steps = 0.0, 0
        reward = self._advance()
        return self._obs(), {"action_mask": self._mask(), "forced_reward": reward}

    @property
    def finished(self) -> bool:
        return not self.waiting and not self.running and not self.pending

    @property
    def offered(self) -> list[int]:
        return self.waiting[: self.max_waiting]

    def step(self, action):
        a = int(action)
        if not (0 <= a < len(self.offered)):
            raise ValueError(
                f"AdmissionEnv: action {a} is not a waiting request ({len(self.offered)} offered); apply "
                "info['action_mask']"
            )
        job = self.waiting.pop(a)
        self.running[job] = 0
        self.fresh.append(job)
        reward = self._advance()
        done = self.finished
        info = {"action_mask": self._mask() if not done else np.eye(self.max_waiting, dtype=bool)[0]}
        if done:
            info["makespan"] = self.clock
        return self._obs(), reward, done, False, info

    def _advance(self) -> float:
        """Step the engine until a place is free while requests wait (the next decision), or all is done;
        an idle engine waits for the next turn a tool returns."""
        assert self.inst is not None
        start, jobs = self.clock, self.inst
        while True:
            while self.pending and self.pending[0][0] <= self.clock:  # tools answered: turns arrive
                self.waiting.append(heapq.heappop(self.pending)[1])
            if self.waiting and len(self.running) < self.slots:
                break
            if not self.running:
                if not self.pending:
                    break
                self.clock = self.pending[0][0]
                continue
            prefill = sum(jobs[j].prompt for j in self.fresh)
            context = sum(jobs[j].prompt + g for j, g in self.running.items())
            self.clock += self.cost.seconds(StepStats(len(self.running) - len(self.fresh), prefill, context))
            self.steps += 1
            self.fresh = []
            for j in list(self.running):
                self.running[j] += 1
                if self.running[j] >= jobs[j].length:
                    del self.running[j]
                    for k in self.after.get(j, ()):
                        heapq.heappush(self.pending, (self.clock + jobs[k].wait_s, k))
        return -(self.clock - start) / self.norm

    def teacher_action(self, name: str) -> int:
        """The action of the heuristic `name` (one of `TEACHERS`) in the current state."""
        assert self.inst is not None
        return teacher_choice(name, [self.inst[j].predicted for j in self.offered])

    def _mask(self) -> np.ndarray:
        mask = np.zeros(self.max_waiting, dtype=bool)
        mask[: len(self.offered)] = True
        return mask

    def _obs(self) -> np.ndarray:
        if self.inst is None:
            return np.zeros((self.max_waiting, FEATURES), dtype=np.float32)
        jobs = self.inst
        return admission_features(
            [jobs[j].predicted for j in self.offered],
            [jobs[j].prompt for j in self.offered],
            [max(1.0, jobs[j].predicted - g) for j, g in self.running.items()],
            self.slots,
            len(self.waiting),
            self.max_waiting,
        )


class LongtailJobs:
    """`n` requests of the `longtail` mix at the tiny model's one token per character: prompt tokens, the
    correct answer's tokens plus eos as the output, and a prediction off by a log-normal factor of spread
    `sigma` (0: exact). A class, so environments holding it pickle into checkpoints."""

    def __init__(self, n: int = 64, sigma: float = 0.5) -> None:
        from schedrl.envs.longtail import LongtailMix

        self.n, self.sigma, self.mix = n, sigma, LongtailMix()

    def __call__(self, rng: np.random.Generator) -> list[Job]:
        tasks = self.mix.sample("train", self.n, int(rng.integers(2**31)))
        lengths = [len(self.mix.solution(t)) + 1 for t in tasks]
        noise = np.exp(rng.normal(0.0, self.sigma, len(tasks))) if self.sigma > 0 else np.ones(len(tasks))
        return [Job(len(t.prompt), n, float(n * e)) for t, n, e in zip(tasks, lengths, noise, strict=True)]


class MultiTurnJobs:
    """`episodes` multi-turn episodes of `min_turns`-`max_turns` model turns. Each turn's output is a
    `longtail` answer (its tokens plus eos), predicted with a log-normal error of spread `sigma`; between
    turns a tool answers after `min_wait_s`-`max_wait_s` seconds with `obs_tokens` tokens, and the next
    turn's prompt is the whole history (prefilled again: the engine's `release` tool-wait policy)."""

    def __init__(
        self,
        episodes: int = 16,
        min_turns: int = 2,
        max_turns: int = 4,
        sigma: float = 0.5,
        min_wait_s: float = 0.005,
        max_wait_s: float = 0.05,
        obs_tokens: int = 8,
    ) -> None:
        from schedrl.envs.longtail import LongtailMix

        if not 1 <= min_turns <= max_turns:
            raise ValueError(
                f"MultiTurnJobs: turns must satisfy 1 <= min_turns <= max_turns, got {min_turns}, {max_turns}"
            )
        if not 0 <= min_wait_s <= max_wait_s:
            raise ValueError(
                f"MultiTurnJobs: waits must satisfy 0 <= min_wait_s <= max_wait_s, got {min_wait_s}, {max_wait_s}"
            )
        self.episodes, self.min_turns, self.max_turns, self.sigma = episodes, min_turns, max_turns, sigma
        self.min_wait_s, self.max_wait_s, self.obs_tokens = min_wait_s, max_wait_s, obs_tokens
        self.mix = LongtailMix()

    def __call__(self, rng: np.random.Generator) -> list[Job]:
        jobs: list[Job] = []
        for _ in range(self.episodes):
            turns = int(rng.integers(self.min_turns, self.max_turns + 1))
            tasks = self.mix.sample("train", turns, int(rng.integers(2**31)))
            context, prev = len(tasks[0].prompt), -1
            for t in tasks:
                n = len(self.mix.solution(t)) + 1
                noise = float(np.exp(rng.normal(0.0, self.sigma))) if self.sigma > 0 else 1.0
                wait = float(rng.uniform(self.min_wait_s, self.max_wait_s)) if prev >= 0 else 0.0
                jobs.append(Job(context, n, n * noise, prev, wait))
                context += n + self.obs_tokens
                prev = len(jobs) - 1
        return jobs


def make_admission_env(
    requests: int = 64, slots: int = 8, sigma: float = 0.5, cost: dict | None = None, max_waiting: int = 64
) -> AdmissionEnv:
    """The registered `schedrl/Admission-v0`: longtail workloads, a step cost (`StepCost` fields)."""
    return AdmissionEnv(LongtailJobs(requests, sigma), slots, StepCost(**(cost or {})), max_waiting)
