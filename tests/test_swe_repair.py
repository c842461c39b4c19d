"""SWE-style repair: the reference patch makes every test pass in the sandbox and the buggy line fails
one; a patch of the wrong line, or one that does not parse, scores 0; SWE-RL's similarity reward in
closed form; a run trains on the task."""

from __future__ import annotations

import difflib

import pytest

from schedrl.envs import make_task
from schedrl.envs.swe_repair import SWERepairTask


@pytest.fixture
def sandbox():
    from schedrl.sandbox.sandbox import unavailable_reason

    if reason := unavailable_reason():
        pytest.skip(reason)


@pytest.mark.sandbox
def test_the_reference_patch_passes_and_the_bug_fails(sandbox):
    source = SWERepairTask()
    for task in source.sample("train", 8, seed=0):
        n = int(task.answer.split(":")[0])
        buggy = f"{n}: {task.metadata['source'].splitlines()[n - 1].strip()}"
        other = f"{6 - n}: return 0"  # the other function's line
        assert source.reward(task, task.answer) == 1.0
        assert source.reward(task, buggy) == 0.0 and source.reward(task, other) == 0.0
        assert source.reward(task, "9: return a") == 0.0 and source.reward(task, "return a+b") == 0.0
        assert f"fails: {'fg'[n // 2 - 1]}(" in task.prompt


def test_the_similarity_reward_in_closed_form():
    source = make_task("swe_repair", reward="similarity")
    (task,) = source.sample("train", 1, seed=1)
    assert source.reward(task, task.answer) == 1.0
    patch = task.answer[:-1] + "7"
    assert source.reward(task, patch) == pytest.approx(
        difflib.SequenceMatcher(None, patch, task.answer).ratio()
    )
    assert source.reward(task, "no patch here") == -1.0
    with pytest.raises(ValueError, match=r"reward must be 'tests' or 'similarity', got 'bleu'"):
        make_task("swe_repair", reward="bleu")


@pytest.mark.sandbox
@pytest.mark.train
def test_a_run_trains_on_swe_repair(tmp_path, sandbox):
    import schedrl
    from schedrl.training.run_dir import read_metrics

    cfg = {
        "steps": 2, "save_every": 0, "out_dir": str(tmp_path), "name": "swe", "sft": {"steps": 20},
        "eval": {"tasks": 4, "k": 1}, "min_start_reward": -1.0, "logging": {"backends": ["jsonl"]},
        "task": {"name": "swe_repair"}, "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 20},
    }  # fmt: skip
    schedrl.train(cfg)
    rows = [r for r in read_metrics(tmp_path / "swe" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2] and rows[0]["reward_errors"] == 0
