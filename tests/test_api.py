"""The Python API: `schedrl.train` with overrides, resume from the command line, and `Trainer`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import schedrl
from schedrl.api import merge_overrides, resolve_config
from schedrl.config import ConfigError
from schedrl.models import build_char_tokenizer, build_tiny_model
from schedrl.orchestrate.step_metrics import TIMING_KEYS
from schedrl.training.run_dir import read_metrics

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "demo.yaml"
TIMING = set(TIMING_KEYS)
SHORT = {"steps": 8, "save_every": 3, "sft": {"steps": 5}, "eval": {"tasks": 8, "k": 2}}


def _deterministic(rows):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def test_keyword_overrides_fields_sections_and_dotted_names():
    cfg = resolve_config(DEMO, {"steps": 7, "optim": {"lr": 1e-4}, "sampling__group_size": 4})
    assert (cfg.steps, cfg.optim.lr, cfg.sampling.group_size) == (7, 1e-4, 4)
    assert cfg.sampling.max_new_tokens == 4  # the rest of the recipe's section is kept
    assert merge_overrides({"a": {"b": 1, "c": 2}}, {"a": {"b": 3}}) == {"a": {"b": 3, "c": 2}}
    with pytest.raises(ConfigError, match="demo.yaml: config field 'steps' must be > 0"):
        resolve_config(DEMO, {"steps": 0})
    with pytest.raises(ConfigError, match="'steps' is not a section"):
        merge_overrides({"steps": 3}, {"steps__x": 1})


@pytest.mark.train
def test_a_run_started_from_python_resumes_from_the_command_line_exactly(tmp_path):
    full = schedrl.train(DEMO, out_dir=str(tmp_path), name="full", **SHORT)
    assert isinstance(full, schedrl.Result) and full.run_dir == tmp_path / "full"
    assert (full.run_dir / "config.yaml").is_file() and full.model_path is not None
    assert [m["step"] for m in full.metrics if "reward_mean" in m] == list(range(1, 9))

    class Crash(Exception):
        pass

    def crash_at_5(step, metrics):
        if step == 5:
            raise Crash  # after the checkpoint of step 3, with step 4 and 5 logged

    with pytest.raises(Crash):
        schedrl.train(DEMO, out_dir=str(tmp_path), name="crashed", on_step=crash_at_5, **SHORT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cli = [sys.executable, "-m", "schedrl.cli", "train", "--resume", str(tmp_path / "crashed")]
    done = subprocess.run(cli, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    resumed = read_metrics(tmp_path / "crashed" / "metrics.jsonl")
    assert _deterministic(resumed) == _deterministic(full.metrics)


def correct(completions, answer, **kwargs):
    return [float(c[0]["content"].strip() == a) for c, a in zip(completions, answer, strict=True)]


def _rows(n: int) -> list[dict]:
    return [
        {
            "prompt": [{"role": "user", "content": f"{i % 10}+{i // 10 % 10}="}],
            "answer": str(i % 10 + i // 10 % 10),
        }
        for i in range(n)
    ]


@pytest.mark.train
def test_trainer_takes_objects_and_records_what_resume_needs(tmp_path, capsys):
    tokenizer = build_char_tokenizer()
    trainer = schedrl.Trainer(
        build_tiny_model(tokenizer),
        tokenizer,
        reward_funcs=[correct, lambda task, completion: -0.01 * len(completion)],
        reward_weights=[1.0, 0.5],
        train_dataset=_rows(100),
        eval_dataset=_rows(20),
        config={
            "steps": 2,
            "save_every": 0,
            "out_dir": str(tmp_path),
            "name": "objects",
            "eval": {"tasks": 4, "k": 1},
        },
    )
    result = trainer.train()
    run = result.run_dir
    saved = resolve_config(run / "config.yaml")
    assert saved.model.path == str(run / "start_model") and (run / "start_model" / "config.json").is_file()
    assert saved.sft.steps == 0  # no warm-up unless asked, as in TRL
    assert saved.task.name == "file" and saved.task.args["reward_weights"] == [1.0, 0.5]
    first, second = saved.task.args["reward"]
    assert first.endswith("test_api:correct") and second == "<in-memory <lambda>>"
    assert len((run / "data" / "train.jsonl").read_text().splitlines()) == 100
    last = next(m for m in reversed(result.metrics) if "reward_mean" in m)
    assert "rewards/correct/mean" in last and "rewards/<lambda>/mean" in last
    # the lambda is not importable: the command line says how to continue instead
    from schedrl.cli import main

    assert main(["train", "--resume", str(run)]) == 2
    assert "Trainer(...same objects...).train(resume=RUN_DIR)" in capsys.readouterr().out.replace("\n", "")
    again = trainer.train(resume=run)  # the same objects: it continues (here: the run is complete)
    assert again.run_dir == run and again.eval_after.keys() == result.eval_after.keys()


def test_trainer_refuses_chat_data_without_a_chat_template(tmp_path):
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = None
    trainer = schedrl.Trainer(
        build_tiny_model(tokenizer),
        tokenizer,
        reward_funcs=correct,
        train_dataset=_rows(10),
        config={"out_dir": str(tmp_path)},
    )
    with pytest.raises(ValueError, match="the tokenizer has no chat template"):
        trainer.train()
    with pytest.raises(ValueError, match="Trainer needs reward_funcs"):
        schedrl.Trainer(train_dataset=_rows(2))


def test_a_run_that_fails_validation_leaves_no_run_directory(tmp_path, capsys):
    from schedrl.cli import main

    for bad in (
        ["task.name=nope"],
        ["algo.loss=nope"],
        ["task.name=file", f"task.args={{path: {tmp_path}/x.jsonl, reward: a:b}}"],
    ):
        sets = [a for s in bad for a in ("--set", s)]
        assert main(["train", *sets, "--set", f"out_dir={tmp_path / 'runs'}"]) == 2
        assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir()), bad
    out = capsys.readouterr().out
    assert "unknown task 'nope'" in out and "sft" not in out.split("error")[0]  # no progress bar before it
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        schedrl.train(task={"name": "nope"}, out_dir=str(tmp_path / "py"))
    assert not (tmp_path / "py").exists()


@pytest.mark.train
def test_the_api_is_quiet_unless_verbose_and_the_demo_does_not_warn_about_its_start(tmp_path, capfd, caplog):
    from transformers.utils import logging as hf_logging

    tiny = {
        "steps": 2,
        "save_every": 2,
        "sft": {"steps": 2},
        "eval": {"tasks": 4, "k": 1},
        "out_dir": str(tmp_path),
    }
    bars = hf_logging.is_progress_bar_enabled()
    schedrl.train(DEMO, name="quiet", **tiny)
    quiet = capfd.readouterr().err
    schedrl.train(DEMO, name="loud", verbose=True, **tiny)
    loud = capfd.readouterr().err
    assert "Writing model shards" in loud and "Writing model shards" not in quiet
    assert hf_logging.is_progress_bar_enabled() == bars  # as it was before the run
    # the demo's start is near 0 by design (T = 1.2, clip-higher): it does not warn about itself
    assert "min_start_reward" not in caplog.text
