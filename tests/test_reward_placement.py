"""Where samples are scored (`pipeline.reward_placement`): the driver, each engine worker between its
engine steps (colocated), or a reward worker of its own (separate). Scoring and counting are split, so a
reward scored elsewhere is counted by the driver; the three placements give the same rewards on the same
samples, and the timeline shows where the reward model ran."""

from __future__ import annotations

import pytest
from test_reward_model import save_reward_model

from schedrl.config import ConfigError
from schedrl.envs.base import Task
from schedrl.envs.scoring import RewardError, RewardScorer
from schedrl.envs.user import FileTask
from schedrl.types import FinishReason, Sample, SamplingParams


def sample(i: int, text: str) -> Sample:
    finish: FinishReason = "stop"
    return Sample(f"r{i}", (1,), (2,), (0.0,), (0,), finish, SamplingParams(), text=text, task_id=f"t{i}")


def test_scores_made_elsewhere_are_counted_by_the_driver():
    def reward(task, completion):
        if completion == "boom":
            raise ValueError("no")
        return float(completion == task.answer)

    rows = [{"id": f"t{i}", "prompt": f"{i}=", "answer": str(i)} for i in range(4)]
    source = FileTask(rows=rows, reward=reward)
    tasks = {f"t{i}": Task(id=f"t{i}", prompt=f"{i}=", answer=str(i), domain="file") for i in range(4)}
    samples = [sample(0, "0"), sample(1, "boom"), sample(2, "7"), sample(3, "3")]
    worker = RewardScorer(source, max_error_rate=1.0)  # where the reward is placed: scores, never judges
    driver = RewardScorer(source, max_error_rate=0.2, min_samples=4)
    scored = worker.score(tasks, samples)
    assert [s.reward for s in scored] == [1.0, 0.0, 0.0, 1.0]
    assert scored[1].reward_error is not None and "ValueError: no" in scored[1].reward_error
    assert worker.total == 0  # scoring counts nothing
    with pytest.raises(RewardError, match=r"raised on 1 of 4 samples \(25.0%\).*ValueError: no"):
        driver.account(scored)
    assert driver.errors == 1


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("rm")
    save_reward_model(path)
    return path


def run_with(tmp_path, rm_dir, placement: str, backend: str = "local"):
    import schedrl
    from schedrl.timeline import TIMELINE_FILE, read_spans
    from schedrl.training.run_dir import read_metrics

    cfg = {
        "steps": 2, "save_every": 0, "out_dir": str(tmp_path), "name": placement, "sft": {"steps": 5},
        "eval": {"tasks": 0}, "min_start_reward": -1e9, "logging": {"backends": ["jsonl"]},
        "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4},
        "task": {"name": "sort", "args": {"min_len": 2, "max_len": 3},
                 "reward_model": {"path": str(rm_dir), "weight": 1.0, "rule_weight": 0.5}},
        "pipeline": {"mode": "async", "backend": backend, "reward_placement": placement},
        "schedule": {"max_staleness": 0},
    }  # fmt: skip
    schedrl.train(cfg)
    rows = [r for r in read_metrics(tmp_path / placement / "metrics.jsonl") if "loss" in r]
    spans = read_spans(tmp_path / placement / TIMELINE_FILE)
    return rows, {(s.worker, s.kind) for s in spans}


@pytest.mark.train
def test_the_three_placements_score_alike_where_they_say(tmp_path, rm_dir):
    model_key = f"rewards/reward_model_{rm_dir.name}/mean"
    results = {p: run_with(tmp_path, rm_dir, p) for p in ("driver", "colocated", "separate")}
    driver_rows, driver_spans = results["driver"]
    for placement, (rows, spans) in results.items():
        assert len(rows) == 2 and all(r["reward_errors"] == 0 for r in rows)
        for r, d in zip(rows, driver_rows, strict=True):  # the same samples, scored alike wherever
            assert r[model_key] == pytest.approx(d[model_key], abs=1e-5), placement
            assert r["rewards/rule/mean"] == pytest.approx(d["rewards/rule/mean"], abs=1e-9), placement
            assert r["reward_mean"] == pytest.approx(0.5 * r["rewards/rule/mean"] + r[model_key], abs=1e-5)
        scored_by = {w for w, kind in spans if kind == "reward"}
        assert scored_by == {"driver": set(), "colocated": {"engine"}, "separate": {"reward"}}[placement]


def test_separate_scoring_runs_beside_threaded_engines(tmp_path, rm_dir):
    rows, spans = run_with(tmp_path, rm_dir, "separate", backend="threads")
    assert len(rows) == 2 and ("reward", "reward") in spans


@pytest.mark.train
@pytest.mark.ray
@pytest.mark.parametrize("placement", ["colocated", "separate"])
def test_rewards_placed_on_ray_actors(tmp_path, rm_dir, ray_cluster, placement):
    """On Ray the task and its reward model are pickled to the engine actor (colocated) or to a reward
    actor of `pipeline.reward_cpus` (separate); the cluster's CPUs are all free again after the run."""
    rows, spans = run_with(tmp_path, rm_dir, placement, backend="ray")
    assert len(rows) == 2 and all(r["reward_errors"] == 0 for r in rows)
    assert ("engine" if placement == "colocated" else "reward", "reward") in spans


def test_separate_needs_the_asynchronous_pipeline(tmp_path, rm_dir):
    import schedrl

    cfg = {
        "out_dir": str(tmp_path), "sft": {"steps": 1},
        "task": {"name": "sort", "reward_model": {"path": str(rm_dir)}},
        "pipeline": {"reward_placement": "separate"},
    }  # fmt: skip
    with pytest.raises(
        ConfigError, match=r"'pipeline.reward_placement' 'separate' .* needs pipeline.mode 'async'"
    ):
        schedrl.train(cfg)
