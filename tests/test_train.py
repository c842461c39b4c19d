"""End-to-end synchronous training: learning, exact resume after SIGKILL, reward errors, the demo."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from schedrl.cli import main
from schedrl.config import config_from_dict
from schedrl.envs.scoring import RewardError
from schedrl.orchestrate.run import train
from schedrl.orchestrate.step_metrics import TIMING_KEYS
from schedrl.training.run_dir import RunDir, read_metrics

TIMING = set(TIMING_KEYS)
REVERSE = {
    "task": {"name": "reverse", "args": {"min_len": 2, "max_len": 3}},
    "sampling": {"prompts_per_step": 16, "group_size": 8, "max_new_tokens": 4},
    "sft": {"steps": 45},
    "optim": {"lr": 3e-4},
    "eval": {"tasks": 16, "k": 2},
}


@pytest.mark.train
def test_short_run_reward_rises(tmp_path):
    cfg = config_from_dict({**REVERSE, "steps": 60, "save_every": 0})
    result = train(cfg, RunDir.create(tmp_path, "rise"))
    rewards = [
        r["reward_mean"] for r in read_metrics(tmp_path / "rise" / "metrics.jsonl") if "reward_mean" in r
    ]
    first, last = sum(rewards[:15]) / 15, sum(rewards[-15:]) / 15
    assert last > first + 0.1, (first, last)
    assert result["eval_after"]["pass@1"] > result["eval_before"]["pass@1"]
    assert (tmp_path / "rise" / "reward.png").stat().st_size > 0


def _cli(run_dir, *args):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "schedrl.cli", "train", *args]
    return subprocess.Popen(cmd, cwd=run_dir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _deterministic(rows):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


@pytest.mark.subprocess
@pytest.mark.train
def test_resume_after_sigkill_gives_identical_metrics(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    cfg = {**REVERSE, "steps": 14, "save_every": 3, "sft": {"steps": 10}, "out_dir": str(tmp_path)}
    recipe.write_text(json.dumps(cfg))  # JSON is YAML
    full = _cli(tmp_path, str(recipe), "--set", "name=full")
    assert full.wait(timeout=300) == 0, full.stderr.read().decode()
    killed = _cli(tmp_path, str(recipe), "--set", "name=killed")
    metrics = tmp_path / "killed" / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline:  # kill once a checkpoint exists and the run is past it
        rows = read_metrics(metrics) if metrics.exists() else []
        if any(r["step"] >= 5 for r in rows):
            break
        time.sleep(0.02)
    assert killed.poll() is None, "the run ended before it could be killed"
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    steps_at_kill = max(r["step"] for r in read_metrics(metrics))
    assert steps_at_kill < 14
    resumed = _cli(tmp_path, "--resume", str(tmp_path / "killed"))
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read().decode()
    a = _deterministic(read_metrics(tmp_path / "full" / "metrics.jsonl"))
    b = _deterministic(read_metrics(metrics))
    assert [r["step"] for r in b] == [r["step"] for r in a]  # nothing lost, nothing repeated
    assert b == a


def test_reward_function_that_raises(tmp_path, monkeypatch):
    module = tmp_path / "flaky_reward.py"
    module.write_text(
        "def sometimes(task, completion):\n"
        "    if task.prompt.startswith('boom'):\n"
        "        raise KeyError('no answer key')\n"
        "    return float(completion.strip() == task.answer)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    rows = [{"prompt": f"{'boom' if i % 10 == 0 else 'ok'}{i}=", "answer": str(i)} for i in range(200)]
    data = tmp_path / "tasks.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows))
    base = {
        "steps": 2,
        "save_every": 0,
        "sft": {"steps": 0},
        "eval": {"tasks": 0},
        "task": {"name": "file", "args": {"path": str(data), "reward": "flaky_reward:sometimes"}},
        "sampling": {"prompts_per_step": 16, "group_size": 4, "max_new_tokens": 3},
    }
    train(config_from_dict({**base, "max_reward_error_rate": 0.5}), RunDir.create(tmp_path, "ok"))
    logged = [
        r["reward_errors"] for r in read_metrics(tmp_path / "ok" / "metrics.jsonl") if "reward_errors" in r
    ]
    assert logged[-1] > 0
    with pytest.raises(
        RewardError, match="raised on .* above max_reward_error_rate=0.01; last error: .*KeyError"
    ):
        train(config_from_dict({**base, "max_reward_error_rate": 0.01}), RunDir.create(tmp_path, "strict"))


@pytest.mark.train
@pytest.mark.smoke
def test_demo_fast(tmp_path, capsys):
    assert main(["demo", "--fast", "--out-dir", str(tmp_path)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    summary = json.loads(last)
    assert {"acc_before", "acc_after", "seconds"} <= set(summary)
    run = RunDir.open(summary["run_dir"])
    assert run.plot_path.exists() and (run.ckpt_dir / "latest").exists()
    assert list(run.tb_dir.iterdir())


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--set", "sampling.group_size=0"], "config field 'sampling.group_size' must be > 0, got 0"),
        (["--set", "optim.lr=abc"], "config field 'optim.lr' must be float, got 'abc'"),
        (["--set", "nonsense=1"], "unknown config key 'nonsense'"),
        (
            [
                "--set",
                "task.name=file",
                "--set",
                "task.args={path: missing.jsonl, reward: 'schedrl.envs:exact_match'}",
            ],
            "missing.jsonl",
        ),
        (["--set", "task.name=nope"], "unknown task 'nope'"),
    ],
)
def test_train_cli_errors(tmp_path, capsys, argv, message):
    assert main(["train", *argv, "--set", f"out_dir={tmp_path}"]) == 2
    assert message in capsys.readouterr().out
