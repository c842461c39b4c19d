"""One loop, three clusters: a weight-sync policy registered once runs in a training run (in one
process and in the asynchronous pipeline), in the simulator and in the simulator's search."""

from __future__ import annotations

import pytest

from schedrl.api import resolve_config
from schedrl.config import ConfigError, config_from_dict
from schedrl.orchestrate.run import train
from schedrl.orchestrate.weight_sync import WEIGHT_SYNC
from schedrl.sim.cluster import ClusterSim
from schedrl.sim.scenario import scenario_from_dict
from schedrl.sim.search import knobs
from schedrl.training.run_dir import RunDir

PUSHED: list[int] = []  # the versions EveryOther sent to the engines, in order


class EveryOther:
    """New weights reach the engines at every second version; an odd one waits, staged, for the next."""

    off_policy = True

    def on_update(self, fleet, weights, version, resend) -> None:
        fleet.stage(weights, version)
        if version % 2 == 0:
            PUSHED.append(version)
            fleet.flush()

    def admits(self, fleet) -> bool:
        return True


@pytest.fixture
def every_other(monkeypatch):
    monkeypatch.setitem(WEIGHT_SYNC._entries, "every_other", (EveryOther, "weights at every second version"))
    PUSHED.clear()
    yield
    PUSHED.clear()


def _run_cfg(tmp_path, name, schedule, **pipeline):
    return config_from_dict(
        {
            "task": {"name": "sort", "args": {"min_len": 2, "max_len": 3}},
            "sft": {"steps": 10, "batch_size": 16, "lr": 1e-3},
            "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4, "temperature": 1.2},
            "algo": {"correction": "decoupled"},
            "eval": {"tasks": 4, "k": 1},
            "min_start_reward": 0.0,
            "steps": 4,
            "save_every": 0,
            "pipeline": pipeline,
            "schedule": schedule,
            "out_dir": str(tmp_path),
            "name": name,
        }
    )


@pytest.mark.train
@pytest.mark.parametrize(
    "pipeline", [{}, {"mode": "async", "backend": "local"}], ids=["one_process", "pipeline"]
)
def test_a_registered_weight_sync_policy_runs_in_training(tmp_path, every_other, pipeline):
    cfg = _run_cfg(tmp_path, "every_other", {"max_staleness": 1, "weight_sync": "every_other"}, **pipeline)
    train(cfg, RunDir.create(tmp_path, cfg.name or "run"))
    assert PUSHED == [2, 4]


def test_a_registered_weight_sync_policy_runs_in_the_simulator_and_its_search(every_other):
    base = {
        "steps": 4,
        "workload": {
            "prompts_per_step": 8,
            "group_size": 4,
            "lengths": {"kind": "fixed", "median": 100, "cap": 100},
        },
        "cluster": {"gpus": 2},
        "sync": {"seconds": 0.2},
    }
    sims = {
        w: ClusterSim(scenario_from_dict({**base, "schedule": {"max_staleness": 1, "weight_sync": w}}))
        for w in ("every_other", "inflight")
    }
    for sim in sims.values():
        sim.run()
    assert PUSHED == [2, 4] and sims["every_other"].fleet.syncs == 2 and sims["inflight"].fleet.syncs == 4
    searched = [v["schedule.weight_sync"] for v in knobs(sims["inflight"].s, 1)["weight sync"]]
    assert searched == ["drain", "inflight", "cut_resume", "every_other"]


def test_an_off_policy_schedule_needs_a_correction_in_one_process_too():
    with pytest.raises(ConfigError, match=r"algo.correction.*inflight"):
        resolve_config({"schedule": {"max_staleness": 1, "weight_sync": "inflight"}})


@pytest.mark.parametrize(
    "schedule",
    [
        {"max_staleness": 1, "weight_sync": "inflight"},
        {"max_staleness": 2, "consumption": "partial", "consumption_args": {"overprovision": 1.5}},
        {"consumption": "tail", "consumption_args": {"eta": 1.5}},
        {
            "max_staleness": 1,
            "weight_sync": "inflight",
            "rollout": "pruning",
            "rollout_args": {"keep": 2, "check_tokens": 1},
        },
    ],
    ids=["k1", "partial_k2", "tail", "pruning_k1"],
)
def test_the_loop_in_one_process_runs_a_schedule_within_its_bound(tmp_path, schedule):
    """`mode: sync` is the loop in one process: k, consumption, weight sync and the rollout mode all apply
    (a batch admitted under older weights trains later, never older than k)."""
    cfg = _run_cfg(tmp_path, "one_process", schedule)
    rows: list[dict] = []
    train(cfg, RunDir.create(tmp_path, "one_process"), on_step=lambda step, m: rows.append(m))
    k = schedule.get("max_staleness", 0)
    assert len(rows) == 4 and all(r["staleness_max"] <= k for r in rows)
    assert (max(r["staleness_max"] for r in rows) > 0) == (k > 0)  # k > 0 is used, not ignored
    if schedule.get("rollout") == "pruning":
        assert all(r["pruned_samples"] > 0 for r in rows)
