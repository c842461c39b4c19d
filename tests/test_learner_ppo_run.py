"""`algo.loss: ppo` end to end: a run trains the value head, checkpoints it, and a resume restores it."""

from __future__ import annotations

import json

import pytest
import torch
from test_learner_algos import one_thread

from schedrl.config import config_from_dict
from schedrl.orchestrate.build import build
from schedrl.orchestrate.run import train
from schedrl.training.checkpoint import latest_checkpoint, load_checkpoint
from schedrl.training.run_dir import RunDir, read_metrics

PPO = {
    "algo": {"loss": "ppo", "loss_args": {"vf_coef": 0.5}, "advantage": "reward"},
    "steps": 2,
    "save_every": 1,
    "sft": {"steps": 0},
    "sampling": {"prompts_per_step": 4, "group_size": 2, "max_new_tokens": 4},
    "eval": {"tasks": 0},
}


@pytest.fixture(autouse=True)
def _one_thread():
    yield from one_thread()


@pytest.mark.train
def test_ppo_config_trains_checkpoints_and_resumes_the_value_head(tmp_path, monkeypatch):
    # a dense reward, so an untrained model already gets varied rewards for the critic to fit
    (tmp_path / "len_reward.py").write_text("def length(task, completion):\n    return len(completion) / 4\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    data = tmp_path / "tasks.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"{i}=", "answer": str(i)}) for i in range(20)))
    task = {"name": "file", "args": {"path": str(data), "reward": "len_reward:length"}}
    cfg = config_from_dict({**PPO, "task": task})
    train(cfg, RunDir.create(tmp_path, "ppo"))
    rows = [r for r in read_metrics(tmp_path / "ppo" / "metrics.jsonl") if "vf_loss" in r]
    assert len(rows) == 2 and all(r["value_mean"] == r["value_mean"] for r in rows)
    ckpt = latest_checkpoint(tmp_path / "ppo" / "checkpoints")
    saved = load_checkpoint(ckpt)[1]["value_head"]
    assert saved["linear.weight"].abs().sum() > 0  # trained away from its zero init
    resumed = build(cfg, RunDir(tmp_path / "ppo"), resume=True)
    try:
        torch.testing.assert_close(
            resumed.learner.value_head.state_dict()["linear.weight"], saved["linear.weight"]
        )
    finally:
        resumed.logger.close()
