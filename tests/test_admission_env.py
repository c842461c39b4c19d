"""The engine's admission as an environment: the step cost model, the simulated engine, the MDP."""

from __future__ import annotations

import numpy as np
import pytest

from schedrl.engine.base import StepStats
from schedrl.envs.scheduling.admission_env import (
    AdmissionEnv,
    Job,
    LongtailJobs,
    MultiTurnJobs,
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

    engine = HFEngine(model, tokenizer, EngineConfig(max_concurrency=8))
    records, expected_rows = [], 0
    # batches of 1 to 8 requests, each run alone: the steps' running rows vary, so the fixed cost of a step
    # and the cost of a row are told apart (at one batch size they are one column, and noise splits them)
    for k, size in enumerate((1, 2, 4, 8) * 2):
        reqs = [
            Request(f"r{k}-{i}", (5, 6, 7 + i % 5), SamplingParams(3 + i % 7, temperature=0, ignore_eos=True))
            for i in range(size)
        ]
        records += measure_steps(engine, reqs)
        expected_rows += sum(3 + i % 7 - 1 for i in range(size))  # the first token comes from the prefill
    assert len(records) == engine.num_steps and all(t > 0 for _, t in records)
    assert sum(s.decode_rows for s, _ in records) == expected_rows
    fit = StepCost.fit(records)
    assert fit.base > 0 and all(np.isfinite([fit.per_row, fit.per_prefill, fit.per_context]))


def test_the_environment_passes_gymnasiums_checker():
    from gymnasium.utils.env_checker import check_env

    env = AdmissionEnv(LongtailJobs(16), 4, StepCost(), max_waiting=16)
    check_env(env, skip_render_check=True)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="not a waiting request"):
        env.step(15 if len(env.offered) < 16 else 99)


def test_a_later_turn_arrives_after_its_tool_and_the_engine_waits_for_it():
    # episode A: a 2-token turn, then after a 5 s tool a 1-token turn; B: one 3-token turn; one slot
    jobs = [Job(10, 2, 2.0), Job(13, 1, 1.0, follows=0, wait_s=5.0), Job(10, 3, 3.0)]
    unit = StepCost(1.0)
    # A first: A1 ends at 2, B runs 2-5 while the tool works, A2 arrives at 7 and ends at 8
    assert simulate(jobs, 1, unit, lambda w: 0) == 8
    # B first: A1 runs 3-5, its tool answers at 10, A2 ends at 11 (the idle engine waited)
    assert simulate(jobs, 1, unit, lambda w: len(w) - 1) == 11
    env = AdmissionEnv(lambda rng: list(jobs), 1, unit, max_waiting=3, normalize=False)
    env.reset(seed=0)
    assert env.offered == [0, 2]  # the later turn is not offered before its tool answers
    env.step(0)
    assert env.offered == [2] and env.pending == [(7.0, 1)]


def test_multi_turn_workloads_grow_each_turn_by_its_history():
    gen = MultiTurnJobs(episodes=6, min_turns=2, max_turns=3, sigma=0.0, min_wait_s=0.01, max_wait_s=0.02)
    jobs = gen(np.random.default_rng(0))
    firsts = [k for k, j in enumerate(jobs) if j.follows < 0]
    assert len(firsts) == 6 and 12 <= len(jobs) <= 18
    for k, j in enumerate(jobs):
        if j.follows >= 0:
            prev = jobs[j.follows]
            assert j.follows == k - 1 and j.prompt == prev.prompt + prev.length + gen.obs_tokens
            assert 0.01 <= j.wait_s <= 0.02
        assert j.predicted == j.length  # sigma 0: exact predictions
    from gymnasium.utils.env_checker import check_env

    check_env(AdmissionEnv(gen, 4, StepCost(1e-3), max_waiting=16), skip_render_check=True)
    with pytest.raises(ValueError, match="min_turns <= max_turns"):
        MultiTurnJobs(min_turns=3, max_turns=2)
