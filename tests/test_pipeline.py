"""The asynchronous pipeline end to end on the tiny model: sync equivalence, Ray actors, threads, failures,
resume."""

from __future__ import annotations

import json
import os

import pytest
import torch

from schedrl.api import resolve_config
from schedrl.config import ConfigError, config_from_dict
from schedrl.distributed import EngineWorker
from schedrl.distributed.workers import cpu_weights
from schedrl.envs import make_task
from schedrl.gantt import write_report
from schedrl.orchestrate.buffer import Group
from schedrl.orchestrate.build import build, load_policy
from schedrl.orchestrate.run import train, warm_start
from schedrl.rollout import group_requests
from schedrl.timeline import TIMELINE_FILE, read_spans
from schedrl.training.checkpoint import latest_checkpoint
from schedrl.training.run_dir import RunDir, read_metrics
from schedrl.types import SamplingParams

BASE = {
    "task": {"name": "sort", "args": {"min_len": 2, "max_len": 3}},
    "sft": {"steps": 30, "batch_size": 32, "lr": 1e-3},
    "sampling": {"prompts_per_step": 6, "group_size": 4, "max_new_tokens": 4, "temperature": 1.2},
    "algo": {"loss_args": {"clip_eps_high": 0.28}},
    "eval": {"tasks": 8, "k": 2},
    "min_start_reward": 0.0,
}


def _cfg(tmp_path, name, steps=3, save_every=0, **pipeline):
    algo = {**BASE["algo"], "correction": "decoupled"} if pipeline.get("mode") == "async" else BASE["algo"]
    schedule = {
        k: pipeline.pop(k) for k in ("max_staleness", "stale", "weight_sync", "consumption") if k in pipeline
    }
    if "overprovision" in pipeline:
        schedule["consumption_args"] = {"overprovision": pipeline.pop("overprovision")}
    return config_from_dict(
        {
            **BASE,
            "algo": algo,
            "steps": steps,
            "save_every": save_every,
            "pipeline": pipeline,
            "schedule": schedule,
            "out_dir": str(tmp_path),
            "name": name,
        }
    )


def _rows(run):
    return [r for r in read_metrics(run.metrics_path) if "reward_mean" in r]


@pytest.mark.train
@pytest.mark.parametrize("engines", [1, 2])
def test_async_with_k0_is_the_synchronous_loop(tmp_path, engines):
    runs = {}
    for name, pipeline in [
        ("sync", {}),
        ("async", {"mode": "async", "backend": "local", "num_engines": engines}),
    ]:
        cfg = _cfg(tmp_path, name, **pipeline)
        if name == "async":  # decoupled PPO with pi_prox = pi_behav = pi_theta is plain PPO: same update
            cfg.algo.correction = "none"
        runs[name] = RunDir.create(cfg.out_dir, cfg.name)
        train(cfg, runs[name])
    sync, asyn = _rows(runs["sync"]), _rows(runs["async"])
    assert [r["reward_mean"] for r in sync] == [r["reward_mean"] for r in asyn]
    assert any(r["reward_mean"] > 0 for r in sync)
    for a, b in zip(sync, asyn, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
        assert a["gen_tokens"] == b["gen_tokens"]
    assert all(r["staleness_max"] == 0 for r in asyn)


@pytest.mark.ray
@pytest.mark.train("four steps on Ray actors, on a cluster the run starts and stops itself")
def test_ray_pipeline_runs_and_reports(tmp_path, no_ray_cluster):
    cfg = _cfg(tmp_path, "ray", steps=4, mode="async", backend="ray", max_staleness=1, weight_sync="inflight")
    run = RunDir.create(cfg.out_dir, cfg.name)
    result = train(cfg, run)
    rows = _rows(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert max(r["staleness_max"] for r in rows) <= 1
    assert "greedy_acc" in result["eval_after"]
    fractions = write_report(run.root)
    assert {"engine", "learner"} <= set(fractions)
    assert (run.root / "timeline.png").stat().st_size > 0
    assert "<svg" in (run.root / "timeline.html").read_text()


@pytest.mark.ray
@pytest.mark.train("four steps on two engine actors, one killed")
def test_killed_engine_is_restarted(tmp_path, ray_cluster):
    """Two engine workers and the learner on the shared cluster; one engine is killed mid-run."""
    from schedrl.distributed import RayBackend
    from schedrl.orchestrate.pipeline import Pipeline

    cfg = _cfg(tmp_path, "kill", steps=4, mode="async", max_staleness=1, num_engines=2)
    run = RunDir.create(cfg.out_dir, cfg.name)
    c = build(cfg, run)
    warm_start(c)
    backend = RayBackend(num_engines=2, engine_cpus=1, learner_cpus=1)
    try:
        killed = []

        def on_step(done, metrics):
            if done == 1:
                killed.append(pipe.engines[1])
                backend.kill(pipe.engines[1])

        pipe = Pipeline(c, backend, on_step)
        pipe.run()
        assert pipe.loop.version == 4 and pipe.fleet.restarts == 1 and pipe.engines[1] is not killed[0]
        assert {e for _, e in pipe.fleet.in_engine.values()} <= {0, 1}
        assert {s.worker for s in read_spans(run.root / TIMELINE_FILE)} == {"engine-0", "engine-1", "learner"}
    finally:
        c.logger.close()
        backend.shutdown()


@pytest.mark.ray
@pytest.mark.train("four steps on two engine actors, one hung past an 8 s timeout")
def test_stuck_engine_actor_is_named_with_its_stack_and_replaced(tmp_path, ray_cluster, caplog):
    """One of two engine actors stops answering after the first update; past `worker_timeout_s` the
    message names it with the stack of the call it is in (read on the actor's watchdog thread), and the
    run replaces it and finishes."""
    import time as time_module

    from schedrl.distributed import RayBackend
    from schedrl.orchestrate.pipeline import Pipeline

    cfg = _cfg(tmp_path, "stuck", steps=4, mode="async", max_staleness=1, num_engines=2, worker_timeout_s=8)
    run = RunDir.create(cfg.out_dir, cfg.name)
    c = build(cfg, run)
    warm_start(c)
    backend = RayBackend(num_engines=2, engine_cpus=1, learner_cpus=1)
    backend.timeout_s = cfg.pipeline.worker_timeout_s

    def hang_in_the_engine(worker):  # runs on the actor, in its one call thread: every later call queues
        time_module.sleep(120)

    try:
        hung = []

        def on_step(done, metrics):
            if done == 1:
                hung.append(pipe.engines[1])
                pipe.engines[1].__ray_call__.remote(hang_in_the_engine)

        pipe = Pipeline(c, backend, on_step)
        with caplog.at_level("WARNING"):
            pipe.run()
        # only the hung engine is replaced: starting an actor (or its replacement) is not counted as stuck
        assert pipe.loop.version == 4 and pipe.fleet.restarts == 1 and pipe.engines[1] is not hung[0]
        logged = caplog.text
        assert "no answer from engine-1" in logged and "(pipeline.worker_timeout_s)" in logged
        assert "in hang_in_the_engine" in logged and "time_module.sleep(120)" in logged
    finally:
        c.logger.close()
        backend.shutdown()


@pytest.mark.train
def test_thread_pipeline_with_k0_is_the_local_one(tmp_path):
    """At k = 0 timing decides nothing, so threads and the serial backend train the same run."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the thread backend's workers run, so the kernels add up alike
    try:
        runs = {}
        for backend in ("local", "threads"):
            cfg = _cfg(tmp_path, backend, steps=3, mode="async", backend=backend)
            runs[backend] = RunDir.create(cfg.out_dir, cfg.name)
            train(cfg, runs[backend])
    finally:
        torch.set_num_threads(threads)
    local, thread = _rows(runs["local"]), _rows(runs["threads"])
    assert [r["reward_mean"] for r in local] == [r["reward_mean"] for r in thread]
    for a, b in zip(local, thread, strict=True):
        assert a["loss"] == b["loss"] and a["gen_tokens"] == b["gen_tokens"]


@pytest.mark.train
@pytest.mark.smoke
def test_thread_pipeline_overlaps_within_the_bound(tmp_path):
    cfg = _cfg(
        tmp_path,
        "overlap",
        steps=5,
        mode="async",
        backend="threads",
        max_staleness=2,
        weight_sync="inflight",
    )
    run = RunDir.create(cfg.out_dir, cfg.name)
    result = train(cfg, run)
    rows = _rows(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert max(r["staleness_max"] for r in rows) <= 2
    assert "greedy_acc" in result["eval_after"]


class Crash(RuntimeError):
    pass


@pytest.mark.train
@pytest.mark.parametrize(
    "pipeline",
    [
        {
            "max_staleness": 1,
            "consumption": "partial",
            "weight_sync": "cut_resume",
            "overprovision": 1.5,
            "stale": "mask",
        },
        {"max_staleness": 2, "weight_sync": "inflight"},
        {
            "max_staleness": 2,
            "weight_sync": "inflight",
            "backend": "threads",
        },  # timing decides the batches
    ],
)
def test_resumed_async_run_loses_and_repeats_no_sample(tmp_path, pipeline):
    cfg = _cfg(tmp_path, "crash", steps=6, save_every=2, mode="async", **{"backend": "local", **pipeline})
    run = RunDir.create(cfg.out_dir, cfg.name)

    def crash(done, metrics):
        if done == 5:
            raise Crash

    with pytest.raises(Crash):
        train(cfg, run, on_step=crash)
    saved = json.loads((latest_checkpoint(run.ckpt_dir) / "state.json").read_text())
    assert saved["step"] == 4 and saved["pipeline"]["version"] == 4
    buffered = {g["id"] for g in saved["pipeline"]["groups"]}
    assert buffered, "the checkpoint should carry unconsumed groups"
    train(cfg, run, resume=True)
    final = json.loads((latest_checkpoint(run.ckpt_dir) / "state.json").read_text())["pipeline"]
    consumed = final["consumed"]
    assert len(consumed) == len(set(consumed)) == 6 * cfg.sampling.prompts_per_step
    assert consumed[: len(saved["pipeline"]["consumed"])] == saved["pipeline"]["consumed"]
    left = {g["id"] for g in final["groups"]}
    issued = {
        f"train/{w}/{i}" for w in range(final["next_wave"]) for i in range(cfg.sampling.prompts_per_step)
    }
    spent = issued - set(consumed) - left  # groups dropped whole as too stale
    assert set(consumed) | left | spent == issued and not (set(consumed) & left)
    assert all(f"{gid}/" in " ".join(final["dropped"]) + " " for gid in spent)
    assert [r["step"] for r in _rows(run)] == [1, 2, 3, 4, 5, 6]


def test_resumed_partial_sample_continues_exactly_within_budget(tokenizer):
    cfg = config_from_dict({})
    weights = cpu_weights(load_policy(config_from_dict({}), None, torch.device("cpu"))[0])
    task = make_task("sort").sample("train", 1, seed=1)[0]
    requests = group_requests(
        [task] * 3, tokenizer, SamplingParams(12, temperature=0.0, ignore_eos=True), 2, seed=0, step=0
    )
    whole = EngineWorker(cfg, weights, 0)
    whole.add(requests)
    full = {s.request_id: s for s in whole.run(100)}
    cut_engine = EngineWorker(cfg, weights, 0)
    cut_engine.add(requests)
    cut_engine.run(5)
    cut = cut_engine.abort_all()
    assert len(cut) == len(requests) and all(0 < s.num_tokens < 12 for s in cut)
    groups = {}
    for r in requests:
        groups.setdefault(r.group_id, Group(r.group_id, task, [])).requests.append(r)
    for s in cut:
        groups[s.group_id].partial[s.sample_index] = s
    restored = [Group.from_dict(json.loads(json.dumps(g.to_dict()))) for g in groups.values()]  # a checkpoint
    resent = [r for g in restored for r in g.to_send()]
    assert all(len(r.prefix_ids) > 0 and r.params.max_new_tokens == 12 for r in resent)
    resumed = EngineWorker(cfg, weights, 0)
    resumed.add(resent)
    again = {s.request_id: s for s in resumed.run(100)}
    for rid, s in full.items():
        assert again[rid].token_ids == s.token_ids and again[rid].num_tokens == 12
        assert again[rid].logprobs == pytest.approx(s.logprobs, abs=1e-5)


def test_async_config_errors():
    with pytest.raises(ConfigError, match="algo.correction"):
        resolve_config({"pipeline": {"mode": "async"}, "schedule": {"max_staleness": 1}})
    with pytest.raises(ConfigError, match="schedule.consumption.*'partial'.*'overprovision'.*0.5"):
        resolve_config({"schedule": {"consumption": "partial", "consumption_args": {"overprovision": 0.5}}})
    with pytest.raises(ConfigError, match="schedule.max_staleness"):
        config_from_dict({"schedule": {"max_staleness": -1}})
    assert os.environ.get("RAY_ADDRESS") is None
