"""A run whose learner is two CPU ranks: it trains as one process does, and its checkpoints resume on
any layout (two ranks saved, one process resumes, and the reverse) continuing as the uninterrupted run."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file

import schedrl
from schedrl.training.run_dir import read_metrics

pytestmark = [pytest.mark.subprocess, pytest.mark.train]

BASE = {
    "steps": 4,
    "save_every": 2,
    "keep_last": None,
    "task": {"name": "sort", "args": {"min_len": 2, "max_len": 3}},
    "sft": {"steps": 30, "batch_size": 32, "lr": 1e-3},
    "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4, "temperature": 1.2},
    "eval": {"tasks": 0},
    "min_start_reward": 0.0,
    "optim": {"micro_batch_size": 6, "micro_batch_tokens": 0},
    "pipeline": {"mode": "async", "backend": "local"},
    "logging": {"backends": ["jsonl"]},
}


def _run(tmp_path, name, parallel="none", ranks=1, **kw):
    schedrl.train(
        {**BASE, "out_dir": str(tmp_path), "name": name, "learner": {"parallel": parallel, "ranks": ranks}},
        **kw,
    )
    return tmp_path / name


def _losses(run):
    return [
        (r["step"], r["loss"], r["reward_mean"]) for r in read_metrics(run / "metrics.jsonl") if "loss" in r
    ]


def _weights(run, step=4):
    return load_file(run / "checkpoints" / f"step_{step:06d}" / "model" / "model.safetensors")


def _same_weights(a, b):
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:  # after the optimizer's steps: a resume without its moments would be ~lr apart
        torch.testing.assert_close(wa[k], wb[k], atol=1e-5, rtol=0)


def _close(a, b):
    assert [s for s, _, _ in a] == [s for s, _, _ in b]
    assert [r for _, _, r in a] == [r for _, _, r in b]  # the same samples: the engines got the same weights
    assert [x for _, x, _ in a] == pytest.approx([x for _, x, _ in b], abs=1e-5)


def test_two_ranks_train_and_resume_across_layouts(tmp_path):
    one = _losses(_run(tmp_path, "one"))
    sharded = _run(tmp_path, "fsdp2", "fsdp2", 2)
    _close(_losses(sharded), one)
    _same_weights(sharded, tmp_path / "one")
    # saved by two ranks at step 2, resumed by one process
    cut = tmp_path / "from_fsdp2"
    shutil.copytree(sharded, cut)
    shutil.rmtree(cut / "checkpoints" / "step_000004")
    (cut / "checkpoints" / "latest").write_text("step_000002")
    schedrl.train(resume=cut, sets=["learner.parallel=none", "learner.ranks=1"])
    _close(_losses(cut)[-2:], one[-2:])
    _same_weights(cut, tmp_path / "one")
    # saved by one process at step 2, resumed by two DDP ranks
    back = tmp_path / "from_one"
    shutil.copytree(tmp_path / "one", back)
    shutil.rmtree(back / "checkpoints" / "step_000004")
    (back / "checkpoints" / "latest").write_text("step_000002")
    schedrl.train(resume=back, sets=["learner.parallel=ddp", "learner.ranks=2"])
    _close(_losses(back)[-2:], one[-2:])
    _same_weights(back, tmp_path / "one")


def test_a_rank_killed_mid_update_fails_the_run_and_resume_continues_exactly(tmp_path, monkeypatch):
    import os
    import signal

    from schedrl.distributed.backend import WorkerDiedError
    from schedrl.distributed.learner_ranks import LearnerRanks

    real = LearnerRanks._gather
    calls = {"update": 0}

    def gather(self, what):
        if what == "running update":
            calls["update"] += 1
            if calls["update"] == 3:  # the ranks have the third update's batch: one dies in the middle of it
                os.kill(self.procs[1].pid, signal.SIGKILL)
        return real(self, what)

    monkeypatch.setattr(LearnerRanks, "_gather", gather)
    with pytest.raises(WorkerDiedError, match=r"learner rank 1 died while running update \(exit code -9\)"):
        _run(tmp_path, "killed", "fsdp2", 2)
    run = tmp_path / "killed"
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000002"  # the last one, complete
    monkeypatch.setattr(LearnerRanks, "_gather", real)
    schedrl.train(resume=run)
    one = _run(tmp_path, "one")
    _close(_losses(run), _losses(one))  # steps 1-4 once each, as the uninterrupted run
    _same_weights(run, one)


def test_lora_on_two_fsdp2_ranks_trains_as_one_process_and_resumes_on_one(tmp_path):
    """LoRA adapters on two FSDP2 ranks: the same losses, adapters and merged policy as one process; a
    checkpoint saved by the ranks (adapters gathered, AdamW's state sharded) resumes on one process."""
    pytest.importorskip("peft")
    lora = {"r": 4, "alpha": 8}
    one = tmp_path / "one"
    schedrl.train({**BASE, "out_dir": str(tmp_path), "name": "one", "learner": {"lora": lora}})
    sharded = tmp_path / "fsdp2"
    learner = {"lora": lora, "parallel": "fsdp2", "ranks": 2}
    schedrl.train({**BASE, "out_dir": str(tmp_path), "name": "fsdp2", "learner": learner})
    _close(_losses(sharded), _losses(one))
    _same_weights(sharded, one)

    def adapters(run):
        return load_file(run / "checkpoints" / "step_000004" / "adapter" / "adapter_model.safetensors")

    a, b = adapters(sharded), adapters(one)
    assert a.keys() == b.keys() and all("lora_" in k for k in a)
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=0)
    cut = tmp_path / "from_fsdp2"
    shutil.copytree(sharded, cut)
    shutil.rmtree(cut / "checkpoints" / "step_000004")
    (cut / "checkpoints" / "latest").write_text("step_000002")
    schedrl.train(resume=cut, sets=["learner.parallel=none", "learner.ranks=1"])
    _close(_losses(cut)[-2:], _losses(one)[-2:])
    _same_weights(cut, one)
