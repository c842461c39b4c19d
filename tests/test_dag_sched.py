"""Heterogeneous DAG scheduling: HEFT on the worked example of its paper, schedules checked, the environment."""

from __future__ import annotations

from itertools import permutations, product

import numpy as np
import pytest

from schedrl.envs.scheduling.dag import (
    DAGInstance,
    DAGSchedule,
    check_schedule,
    heft,
    random_dag,
    random_list,
    upward_rank,
)

# Topcuoglu, Hariri and Wu (2002), Fig. 2: ten tasks on three processors.
COST = [[14, 16, 9], [13, 19, 18], [11, 13, 19], [13, 8, 17], [12, 13, 10],
        [13, 16, 9], [7, 15, 11], [5, 11, 14], [18, 12, 20], [21, 7, 16]]  # fmt: skip
ARCS = {(1, 2): 18, (1, 3): 12, (1, 4): 9, (1, 5): 11, (1, 6): 14, (2, 8): 19, (2, 9): 16, (3, 7): 23,
        (4, 8): 27, (4, 9): 23, (5, 9): 13, (6, 8): 15, (7, 10): 17, (8, 10): 11, (9, 10): 13}  # fmt: skip


def paper_example() -> DAGInstance:
    comm, arcs = np.zeros((10, 10)), np.zeros((10, 10), dtype=bool)
    for (a, b), c in ARCS.items():
        comm[a - 1, b - 1], arcs[a - 1, b - 1] = c, True
    return DAGInstance(np.array(COST, dtype=float), comm, arcs, "topcuoglu-fig2")


def test_heft_reproduces_the_papers_worked_example():
    inst = paper_example()
    rank = upward_rank(inst)
    # Table 2 of the paper: the upward ranks, and the schedule length of 80
    want = [108.000, 77.000, 80.000, 80.000, 69.000, 63.333, 42.667, 35.667, 44.333, 14.667]
    np.testing.assert_allclose(rank, want, atol=1e-3)
    s = heft(inst)
    check_schedule(inst, s)
    assert s.makespan == pytest.approx(80.0)
    assert s.proc[0] == 2 and s.start[0] == 0  # n1 on P3 (its fastest), at 0


def _brute_force(inst: DAGInstance) -> float:
    """The best makespan over every topological order and processor assignment (appending, no insertion):
    a list schedule covers every active schedule, so this is the optimum of small instances."""
    best = np.inf
    n = inst.num_tasks
    for order in permutations(range(n)):
        pos = {t: k for k, t in enumerate(order)}
        if any(pos[i] > pos[j] for i, j in zip(*np.nonzero(inst.arcs), strict=True)):
            continue
        for assign in product(range(inst.num_procs), repeat=n):
            proc, finish, free = np.array(assign), np.zeros(n), np.zeros(inst.num_procs)
            for j in order:
                ready = max(
                    (finish[i] + (inst.comm[i, j] if proc[i] != proc[j] else 0) for i in inst.preds(j)),
                    default=0,
                )
                finish[j] = max(free[proc[j]], ready) + inst.cost[j, proc[j]]
                free[proc[j]] = finish[j]
            best = min(best, finish.max())
    return best


def test_heft_and_random_schedules_are_valid_and_never_beat_the_optimum():
    rng = np.random.default_rng(0)
    ratios = []
    for _ in range(12):
        inst = random_dag(rng, 6, 2, ccr=1.0)
        opt = _brute_force(inst)
        h, r = heft(inst), random_list(inst, rng)
        check_schedule(inst, h)
        check_schedule(inst, r)
        assert h.makespan >= opt - 1e-9 and r.makespan >= opt - 1e-9
        ratios.append(h.makespan / opt)
    assert np.mean(ratios) < 1.2  # HEFT is near-optimal on small graphs


def test_random_dags_are_topological_connected_and_carry_the_knobs():
    rng = np.random.default_rng(1)
    for n in (5, 20, 50):
        inst = random_dag(rng, n, 4, beta=0.5, ccr=2.0)
        i, j = np.nonzero(inst.arcs)
        assert (i < j).all()  # tasks are numbered in topological order
        assert all(inst.arcs[:, t].any() for t in range(1, n))  # every task but the entry waits on one
        spread = inst.cost.max(1) / inst.cost.min(1)
        assert spread.max() <= (1 + 0.25) / (1 - 0.25) + 1e-9  # beta = 0.5 bounds the heterogeneity
    with pytest.raises(ValueError, match="need 0 <= beta <= 2"):
        random_dag(rng, 10, 3, beta=3.0)


def test_check_schedule_names_what_is_broken():
    inst = paper_example()
    s = heft(inst)
    early = DAGSchedule(s.proc.copy(), s.start.copy(), s.finish.copy())
    early.start[9] -= 5
    early.finish[9] -= 5
    with pytest.raises(ValueError, match="task 9 starts at"):
        check_schedule(inst, early)


def _play(env, choose) -> float:
    obs, info = env.reset(seed=0)
    done = False
    while not done:
        obs, _, done, _, info = env.step(choose(env, obs, info["action_mask"]))
    return info["makespan"]


def _heft_pair(env, obs, mask) -> int:
    """HEFT's decision: the highest-ranked ready task (feature 5 = 1), on its earliest-finishing processor."""
    rows = np.flatnonzero(mask)
    return int(max(rows, key=lambda r: (obs[r, 5], obs[r, 6], -obs[r, 3])))


def test_the_environment_builds_heft_when_it_follows_hefts_rule_and_valid_schedules_otherwise():
    from schedrl.envs.scheduling.dag_env import DAGSchedEnv, FixedDAG, RandomDAGs

    inst = paper_example()
    env = DAGSchedEnv(FixedDAG(inst), 3, max_ready=8)
    assert _play(env, _heft_pair) == pytest.approx(heft(inst).makespan)
    check_schedule(inst, env.schedule)
    rng = np.random.default_rng(2)
    for _ in range(5):
        inst = random_dag(rng, 25, 3)
        env = DAGSchedEnv(FixedDAG(inst), 3, max_ready=32)
        assert _play(env, _heft_pair) == pytest.approx(heft(inst).makespan)
        _play(env, lambda e, o, m: int(rng.choice(np.flatnonzero(m))))
        check_schedule(inst, env.schedule)
    env = DAGSchedEnv(RandomDAGs([12, 20]), 3, max_ready=4)
    obs, info = env.reset(seed=3)
    ret, done = 0.0, False
    while not done:
        obs, r, done, _, info = env.step(int(np.flatnonzero(info["action_mask"])[0]))
        ret += r
    assert ret == pytest.approx(-info["makespan"] / env.lb)  # the return is -makespan / LB
    assert info["makespan"] >= env.lb


def test_the_environment_passes_gymnasiums_checker_and_refuses_an_unoffered_pair():
    import gymnasium as gym
    from gymnasium.utils.env_checker import check_env

    import schedrl.classic.envs  # noqa: F401  (registers schedrl/DAGSched-v0)

    env = gym.make("schedrl/DAGSched-v0", sizes=[8], max_ready=4).unwrapped
    check_env(env, skip_render_check=True)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="not an offered"):
        env.step(env.rows - 1)


def test_the_committed_policy_schedules_held_out_graphs_no_longer_than_heft():
    """bench/policies/dag_attention.pt (examples/dag_ppo.yaml, 200k steps): greedy, on held-out 20-task graphs."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from dag_sched import HELD_OUT_SEED, POLICY, run_policy

    from schedrl.classic.attention import load_entity_policy

    policy, trained = load_entity_policy(POLICY)
    assert trained["env_steps"] >= 200_000
    ratios = []
    for g in range(12):
        inst = random_dag(np.random.default_rng(HELD_OUT_SEED + 20_000 + g), 20, 3)
        ratios.append(
            run_policy(policy, inst, 1, g, 16) / heft(inst).makespan
        )  # run_policy checks each schedule
    assert np.mean(ratios) < 1.0, ratios
