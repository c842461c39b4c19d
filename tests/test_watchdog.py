"""The watchdog: a worker that answers no call for `pipeline.worker_timeout_s` is named with its stack,
the run stops without waiting on it forever, and it resumes from its last checkpoint."""

from __future__ import annotations

import functools
import signal
import threading
import time
from pathlib import Path

import pytest

import schedrl
from schedrl.distributed import WorkerStuckError
from schedrl.distributed.workers import EngineWorker

DEMO = Path(__file__).resolve().parents[1] / "examples" / "demo.yaml"


@pytest.fixture(autouse=True)
def default_sigint():
    """The watchdog interrupts a phase only under Python's own SIGINT handler (a handler of the user's
    is left alone); a handler an earlier test in this process left behind must not decide these."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


RUN = {
    "steps": 6,
    "save_every": 2,
    "sft": {"steps": 2},
    "eval": {"tasks": 4, "k": 1},
    "sampling": {"prompts_per_step": 4, "group_size": 4},
    "pipeline": {"mode": "async", "backend": "threads", "worker_timeout_s": 2.0},
    "algo": {"correction": "decoupled"},
}


@pytest.mark.train
def test_a_hung_engine_is_named_with_its_stack_and_the_run_resumes(tmp_path, monkeypatch):
    release = threading.Event()
    real_run, calls = EngineWorker.run, [0]

    @functools.wraps(real_run)  # calls reach a worker's method by its name
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


@pytest.mark.train
def test_a_worker_that_builds_longer_than_the_timeout_is_not_stuck(tmp_path, monkeypatch, caplog):
    """Loading a model is not a call: an engine that takes 3 s to build, against a 2 s
    `worker_timeout_s`, is reported as still building and the run goes on (it used to stop as stuck)."""
    real_init = EngineWorker.__init__

    def slow_build(self, *args, **kwargs):
        time.sleep(3.0)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(EngineWorker, "__init__", slow_build)
    with caplog.at_level("WARNING", logger="schedrl.distributed.backend"):
        result = schedrl.train(
            DEMO, out_dir=str(tmp_path), name="slow", **{**RUN, "steps": 2, "save_every": 0}
        )
    assert [m["step"] for m in result.metrics if "reward_mean" in m] == [1, 2]
    assert "still building after 2 s: engine;" in caplog.text and "in slow_build" in caplog.text


def test_a_worker_that_fails_to_build_names_its_error(tmp_path, monkeypatch):
    def broken(self, *args, **kwargs):
        raise OSError("no such file: /models/policy.safetensors")

    monkeypatch.setattr(EngineWorker, "__init__", broken)
    with pytest.raises(OSError, match="policy.safetensors"):
        schedrl.train(DEMO, out_dir=str(tmp_path), name="broken", **{**RUN, "steps": 2, "save_every": 0})


@pytest.mark.train
def test_a_hung_learner_in_the_synchronous_loop_is_named_and_the_run_resumes(tmp_path, monkeypatch):
    """The synchronous loop runs engine and learner in its own thread: only the watchdog's thread can see
    a hang there. It names the phase with the loop's stack and interrupts it; the run resumes."""
    from schedrl.training.learner import Learner

    real_update, calls = Learner.update, [0]

    def hang_here(self, *args, **kwargs):  # the third update never returns by itself
        calls[0] += 1
        if calls[0] == 3:
            threading.Event().wait(60)
        return real_update(self, *args, **kwargs)

    monkeypatch.setattr(Learner, "update", hang_here)
    sync = {**RUN, "pipeline": {"worker_timeout_s": 2.0}, "algo": {}}
    start = time.perf_counter()
    with pytest.raises(WorkerStuckError) as info:
        schedrl.train(DEMO, out_dir=str(tmp_path), name="hung", **sync)
    assert time.perf_counter() - start < 60  # interrupted, not waited out
    message = str(info.value)
    assert "no answer from learner (update of step 3) for 2 s (pipeline.worker_timeout_s)" in message
    assert "in hang_here" in message and "threading.Event().wait(60)" in message
    assert "--resume" in message
    monkeypatch.setattr(Learner, "update", real_update)
    resumed = schedrl.train(resume=tmp_path / "hung")
    assert [m["step"] for m in resumed.metrics if "reward_mean" in m] == list(range(1, 7))


@pytest.mark.train
def test_the_watchdog_stays_quiet_for_phases_within_their_time():
    from schedrl.orchestrate.watchdog import Watchdog

    watchdog = Watchdog(0.5)
    try:
        for _ in range(5):
            with watchdog.phase("engine", "a short phase"):
                time.sleep(0.2)
        assert watchdog.fired is None
        long = watchdog.phase("engine", "a long phase")
        with pytest.raises(WorkerStuckError, match=r"no answer from engine \(a long phase\) for 0.5 s"), long:
            time.sleep(5)
    finally:
        watchdog.close()
