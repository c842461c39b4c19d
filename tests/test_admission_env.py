"""The engine's admission as an environment: the step cost model, the simulated engine, the MDP."""

from __future__ import annotations

import numpy as np
import pytest

from schedrl.engine.base import StepStats
from schedrl.envs.scheduling.admission_env import (
    AdmissionEnv,
    Job,
    LongtailJobs,
    StepCost,
    measure_steps,
    simulate,
)


def test_step_cost_fit_recovers_known_coefficients_and_drops_negative_ones():
    rng = np.random.default_rng(0)
    true = StepCost(0.002, 1e-4, 3e-5, 2e-7)
    stats = [StepStats(int(r), int(p), int(c)) for r, p, c in rng.integers(0, 500, (200, 3))]
    fit = StepCost.fit([(s, true.seconds(s)) for s in stats])
    np.testing.assert_allclose([fit.base, fit.per_row, fit.per_prefill, fit.per_context],
                               [0.002, 1e-4, 3e-5, 2e-7], rtol=1e-6)  # fmt: skip
    flat = StepCost.fit([(s, 0.01 - 1e-9 * s.context_tokens) for s in stats])  # a negative slope is noise
    assert flat.per_context == 0.0 and flat.base == pytest.approx(
        0.01 - 1e-9 * np.mean([s.context_tokens for s in stats]), rel=1e-3
    )
    with pytest.raises(ValueError, match="at least 4 steps"):
        StepCost.fit([(stats[0], 1.0)])


def test_the_simulated_engine_counts_steps_as_continuous_batching_does():
    jobs = [Job(3, 4, 4.0), Job(3, 1, 1.0), Job(3, 2, 2.0)]
    unit = StepCost(1.0)  # one second per step: the makespan counts steps
    assert simulate(jobs, 1, unit, lambda w: 0) == 7  # one slot: 4 + 1 + 2
    assert simulate(jobs, 3, unit, lambda w: 0) == 4  # all at once: the longest
    # two slots: FCFS runs 0 and 1, then 2 when 1 ends after step 1: 1 + 2 = 3 < 4, so 4 steps
    assert simulate(jobs, 2, unit, lambda w: 0) == 4
    # two slots, shortest first: 1 and 2 start, 0 starts after step 1 and ends at 1 + 4 = 5
    shortest = lambda w: min(range(len(w)), key=lambda i: jobs[w[i]].predicted)  # noqa: E731
    assert simulate(jobs, 2, unit, shortest) == 5
    prefill = StepCost(0.0, per_prefill=1.0)  # only prefill costs: each prompt once
    assert simulate(jobs, 2, prefill, lambda w: 0) == 9


def test_the_episode_returns_minus_makespan_over_fcfs_and_fcfs_scores_minus_one():
    env = AdmissionEnv(LongtailJobs(48, sigma=0.0), 8, StepCost(1e-3, 1e-4, 1e-5, 1e-7), max_waiting=48)

    def play(choose) -> tuple[float, float]:
        obs, info = env.reset(seed=3)
        ret, done = info["forced_reward"], False
        while not done:
            obs, r, done, _, info = env.step(choose(obs, info["action_mask"]))
            ret += r
        return ret, info["makespan"]

    ret, makespan = play(lambda obs, mask: 0)
    assert ret == pytest.approx(-1.0) and makespan == pytest.approx(env.norm)  # FCFS against itself
    ret, makespan = play(lambda obs, mask: int(np.argmax(np.where(mask, obs[:, 1], -1))))  # longest first
    assert ret == pytest.approx(-makespan / env.norm) and ret != pytest.approx(-1.0)


def test_longest_predicted_first_beats_fcfs_on_the_long_tail_in_simulation():
    work = LongtailJobs(64, sigma=0.0)
    cost = StepCost(1e-3, 1e-4, 1e-5, 0.0)
    wins = []
    for seed in range(5):
        jobs = work(np.random.default_rng(seed))
        fcfs = simulate(jobs, 8, cost, lambda w: 0)
        lpt = simulate(
            jobs, 8, cost, lambda w, jobs=jobs: max(range(len(w)), key=lambda i: jobs[w[i]].predicted)
        )
        wins.append(fcfs / lpt)
    assert np.mean(wins) > 1.05, wins


def test_measured_steps_of_the_real_engine_calibrate_a_cost_model(model, tokenizer):
    from schedrl.engine import EngineConfig, HFEngine
    from schedrl.types import Request, SamplingParams

    engine = HFEngine(model, tokenizer, EngineConfig(max_concurrency=4))
    reqs = [
        Request(f"r{i}", (5, 6, 7 + i % 5), SamplingParams(3 + i % 7, temperature=0, ignore_eos=True))
        for i in range(24)
    ]
    records = measure_steps(engine, reqs)
    assert len(records) == engine.num_steps and all(t > 0 for _, t in records)
    assert sum(s.decode_rows for s, _ in records) + len(reqs) == sum(3 + i % 7 for i in range(24))
    fit = StepCost.fit(records)
    assert fit.base > 0 and all(np.isfinite([fit.per_row, fit.per_prefill, fit.per_context]))


def test_the_environment_passes_gymnasiums_checker():
    from gymnasium.utils.env_checker import check_env

    env = AdmissionEnv(LongtailJobs(16), 4, StepCost(), max_waiting=16)
    check_env(env, skip_render_check=True)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="not a waiting request"):
        env.step(15 if len(env.offered) < 16 else 99)
