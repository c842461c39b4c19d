"""The synchronous trainer with a non-uniform data scheduler: variable group sizes, exact resume."""

import json
import shutil

import pytest

from schedrl.config import config_from_dict
from schedrl.orchestrate.run import train
from schedrl.orchestrate.step_metrics import TIMING_KEYS
from schedrl.training.run_dir import RunDir, read_metrics

TIMING = set(TIMING_KEYS)
CFG = {
    "steps": 4,
    "save_every": 2,
    "sft": {"steps": 0},
    "eval": {"tasks": 0},
    "min_start_reward": 0.0,
    "task": {"name": "tiered"},
    "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4},
    "schedule": {
        "data": "difficulty_profile",
        "data_args": {"pool_size": 12, "probe_samples": 2, "max_group": 8},
    },
}


def rows(run_root):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in read_metrics(run_root / "metrics.jsonl")]


@pytest.mark.train
def test_sync_trainer_with_difficulty_profile_resumes_exactly(tmp_path):
    cfg = config_from_dict({**CFG, "out_dir": str(tmp_path)})
    train(cfg, RunDir.create(tmp_path, "full"))
    full = tmp_path / "full"
    state = json.loads((full / "checkpoints" / "step_000004" / "state.json").read_text())
    assert state["data"]["position"] == 4 and state["data"]["stats"]["tasks"]  # per-task statistics saved
    samples = [r["gen_tokens"] for r in rows(full) if "gen_tokens" in r]
    assert len(samples) == 4

    # Roll a copy back to its step-2 checkpoint and resume: the scheduler must pick up where it was.
    shutil.copytree(full, tmp_path / "resumed")
    ckpts = tmp_path / "resumed" / "checkpoints"
    shutil.rmtree(ckpts / "step_000004")
    (ckpts / "latest").write_text("step_000002")
    train(cfg, RunDir(tmp_path / "resumed"), resume=True)
    assert rows(tmp_path / "resumed") == rows(full)
