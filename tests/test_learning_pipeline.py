"""The critic-based and non-PPO algorithms through the whole synchronous pipeline (engine, task,
config) on the reverse task after a short SFT warm-up: the reward rises. Slow: minutes each."""

from __future__ import annotations

import pytest
from test_train import REVERSE

from schedrl.config import config_from_dict
from schedrl.orchestrate.run import train
from schedrl.training.run_dir import RunDir, read_metrics

ALGOS = {
    "ppo": {"loss": "ppo", "loss_args": {"vf_coef": 0.5}, "advantage": "reward"},
    "sao": {"loss": "sao", "loss_args": {"vf_coef": 0.5}, "advantage": "reward"},
    "rover": {"loss": "rover", "std_normalize": False},
    "pacs": {"loss": "pacs", "advantage": "reward"},
    "rapid": {"loss": "rapid"},
}
EXTRA = {
    "sao": {"sampling": {**REVERSE["sampling"], "prompts_per_step": 128, "group_size": 1}},
    "rapid": {"optim": {"lr": 3e-4, "minibatches": 4}},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ALGOS))
def test_pipeline_reward_rises(tmp_path, name):
    run = {"steps": 60, "save_every": 0, "eval": {"tasks": 0}, "algo": ALGOS[name]}
    cfg = config_from_dict({**REVERSE, **run, **EXTRA.get(name, {})})
    train(cfg, RunDir.create(tmp_path, name))
    rewards = [
        r["reward_mean"] for r in read_metrics(tmp_path / name / "metrics.jsonl") if "reward_mean" in r
    ]
    first, last = sum(rewards[:15]) / 15, sum(rewards[-15:]) / 15
    assert last > first + 0.1, (first, last)
