"""`bench/gpu_check.sh --dry`: the GPU checks' script run end to end on CPU at toy sizes, so it is known to
work before a GPU is lent to run it for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def last_json(text: str) -> dict:
    return json.loads(next(line for line in reversed(text.splitlines()) if line.startswith("{")))


def dry_run(tmp_path, *flags: str) -> None:
    """`bench/gpu_check.sh --dry` with `flags`, its logs in `tmp_path`; it must succeed."""
    env = {**os.environ, "PY": sys.executable, "OUT": str(tmp_path)}
    cmd = ["bash", "bench/gpu_check.sh", "--dry", *flags]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]


@pytest.mark.subprocess
@pytest.mark.train("bench/gpu_check.sh dry on the CPU: every check it runs on a GPU, on the tiny model")
def test_the_gpu_checks_run_dry_on_cpu(tmp_path):
    dry_run(tmp_path)
    assert "cuda False" in (tmp_path / "device.txt").read_text()
    assert " passed" in (tmp_path / "contract.txt").read_text()
    small = last_json((tmp_path / "engine_throughput_small.txt").read_text())
    large = last_json((tmp_path / "engine_throughput_0.5b.txt").read_text())
    assert small["model"] == "tiny" and large["dtype"] == "bfloat16"
    waits = last_json((tmp_path / "tool_waits.txt").read_text())
    assert waits["best_policy"] == "pin" and waits["best_policy_vs_release"] > 0
    assert "step" in (tmp_path / "rollout_scheduling.txt").read_text()
    assert (tmp_path / "train.txt").read_text().strip()


@pytest.mark.subprocess
@pytest.mark.train
def test_the_learner_check_runs_dry_on_cpu(tmp_path):
    dry_run(tmp_path, "--learner")
    result = last_json((tmp_path / "learner.txt").read_text())
    assert result["compute_dtype"] == "bfloat16" and result["gradient_checkpointing"]
    assert result["full"]["step_s"] > 0 and result["lora"]["peak_mb"] > 0
