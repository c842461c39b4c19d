"""The watchdog: a worker that answers no call for `pipeline.worker_timeout_s` is named with its stack,
the run stops without waiting on it forever, and it resumes from its last checkpoint."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import schedrl
from schedrl.distributed import WorkerStuckError
from schedrl.distributed.workers import EngineWorker

DEMO = Path(__file__).resolve().parents[1] / "examples" / "demo.yaml"
RUN = {
    "steps": 6,
    "save_every": 2,
    "sft": {"steps": 2},
    "eval": {"tasks": 4, "k": 1},
    "sampling": {"prompts_per_step": 4, "group_size": 4},
    "pipeline": {"mode": "async", "backend": "threads", "worker_timeout_s": 2.0},
    "algo": {"correction": "decoupled"},
}


def test_a_hung_engine_is_named_with_its_stack_and_the_run_resumes(tmp_path, monkeypatch):
    release = threading.Event()
    real_run, calls = EngineWorker.run, [0]

    def hang_here(self, *args, **kwargs):  # the engine's 8th call (of ~12) never answers until released
        calls[0] += 1
        if calls[0] == 8:
            release.wait(60)
        return real_run(self, *args, **kwargs)

    monkeypatch.setattr(EngineWorker, "run", hang_here)
    start = time.perf_counter()
    try:
        with pytest.raises(WorkerStuckError) as info:
            schedrl.train(DEMO, out_dir=str(tmp_path), name="hung", **RUN)
    finally:
        release.set()  # let the stuck thread end
    message = str(info.value)
    assert "no answer from engine for 2 s (pipeline.worker_timeout_s)" in message
    assert "in hang_here" in message and "release.wait" in message  # where the engine's thread is
    assert "--resume" in message
    assert time.perf_counter() - start < 90  # the run did not wait on the stuck thread
    monkeypatch.setattr(EngineWorker, "run", real_run)
    resumed = schedrl.train(resume=tmp_path / "hung")
    assert [m["step"] for m in resumed.metrics if "reward_mean" in m] == list(range(1, 7))
