"""The pipeline's bookkeeping over random schedules (hypothesis), on a fake engine and learner.

The fake engine behaves like `EngineWorker` (concurrency cap, one token per running
request per step, per-token versions, abort keeps the prefix, weights between calls);
the backend hands results back in a random order, as real workers would finish. Over
every schedule: no trained-on token is older than k, and every issued sample is
consumed once, dropped, or still buffered -- never lost, never trained on twice.

With `multi_turn` the fake engine behaves like `EpisodeEngine`: every third token of a
trajectory is a tool's (never trained, no version), the samples come scored by their
environment, and an abort suspends the trajectory (an empty sample) until it is sent again,
when it resumes where it was cut with its versions.
"""

from __future__ import annotations

import random
import zlib
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from schedrl.config import config_from_dict
from schedrl.contracts import LearnerBatch
from schedrl.data import DataContext, make_scheduler
from schedrl.distributed.backend import LocalBackend
from schedrl.engine.migration import migrants
from schedrl.engine.preemption import Running
from schedrl.envs import make_task
from schedrl.envs.scoring import RewardScorer
from schedrl.orchestrate.build import Components
from schedrl.orchestrate.pipeline import Pipeline
from schedrl.training.run_dir import RunDir
from schedrl.types import Request, Sample


class FakeEngine:
    def __init__(self, cfg, weights, version):
        self.version, self.cap = version, cfg.engine.max_concurrency
        self.multi_turn = cfg.task.env != "single_turn"
        self.waiting: list[Request] = []
        self.running: dict[str, list] = {}  # id -> [request, tokens, versions, trained]
        self.suspended: dict[str, list] = {}  # multi-turn: cut trajectories, resumed when sent again

    def _target(self, r: Request) -> int:
        return 1 + zlib.crc32(r.id.encode()) % r.params.max_new_tokens

    def add(self, requests, tasks=None):
        for r in requests:
            assert r.id not in self.running and all(w.id != r.id for w in self.waiting), f"{r.id} sent twice"
            assert len(r.prefix_ids) < r.params.max_new_tokens
            if self.multi_turn:
                assert not r.prefix_ids, "a trajectory's cut tokens never leave its engine"
                assert tasks is not None and r.task_id in tasks, "an episode's task goes with it"
        self.waiting += requests

    def run(self, max_steps):
        out = []
        for _ in range(max_steps):
            while self.waiting and len(self.running) < self.cap:
                r = self.waiting.pop(0)
                state = self.suspended.pop(r.id, None)
                self.running[r.id] = state or [
                    r,
                    list(r.prefix_ids),
                    list(r.prefix_versions),
                    [True] * len(r.prefix_ids),
                ]
            if not self.running:
                break
            for rid, (r, toks, vers, trained) in list(self.running.items()):
                toks.append(7)
                vers.append(self.version)
                trained.append(True)
                if self.multi_turn and sum(trained) % 2 == 0:  # a tool answers every second model token
                    toks.append(9)
                    vers.append(-1)
                    trained.append(False)
                if sum(trained) >= self._target(r):
                    del self.running[rid]
                    out.append(self._sample(r, toks, vers, "stop", trained))
        return out

    def _sample(self, r, toks, vers, reason, trained=()):
        assert sum(trained) <= r.params.max_new_tokens, "a resumed sample outgrew its budget"
        if self.multi_turn and reason == "aborted":
            return Sample(r.id, r.prompt_ids, (), (), (), "aborted", r.params, task_id=r.task_id,
                          group_id=r.group_id, sample_index=r.sample_index)  # fmt: skip
        if self.multi_turn:
            return Sample(
                r.id, r.prompt_ids, tuple(toks), tuple(-1.0 for _ in toks), tuple(vers), reason, r.params,
                task_id=r.task_id, group_id=r.group_id, sample_index=r.sample_index, reward=1.0,
                trained=tuple(trained),
            )  # fmt: skip
        return Sample(
            r.id,
            r.prompt_ids,
            tuple(toks),
            tuple(-1.0 for _ in toks),
            tuple(vers),
            reason,
            r.params,
            text="",
            task_id=r.task_id,
            group_id=r.group_id,
            sample_index=r.sample_index,
        )

    def abort(self, ids):  # abandoned for good (tail batching): an episode is discarded, suspended or not
        ids = set(ids)
        for rid in ids:  # a resent episode waits with its cut state: it goes too
            self.suspended.pop(rid, None)
        cut = [
            self._sample(r, list(r.prefix_ids), list(r.prefix_versions), "aborted")
            for r in self.waiting
            if r.id in ids
        ]
        cut += [self._sample(r, t, v, "aborted") for rid, (r, t, v, _) in self.running.items() if rid in ids]
        self.waiting = [r for r in self.waiting if r.id not in ids]
        self.running = {rid: run for rid, run in self.running.items() if rid not in ids}
        return cut

    def hand_over(self, n):  # long-tail migration: the engine's own rule picks, abort cuts
        running = [Running(r, len(t), k) for k, (r, t, _, _) in enumerate(self.running.values())]
        return self.abort(migrants([r.id for r in self.waiting], running, n))

    def abort_all(self):
        cut = [self._sample(r, list(r.prefix_ids), list(r.prefix_versions), "aborted") for r in self.waiting]
        cut += [self._sample(r, t, v, "aborted") for r, t, v, _ in self.running.values()]
        if self.multi_turn:
            self.suspended.update(self.running)
        self.waiting, self.running = [], {}
        return cut

    def update_weights(self, weights, version):
        assert version >= self.version
        self.version = version
        return version

    def spans(self):
        return []

    def counters(self):  # a multi-turn worker's episode counts: this engine runs no tools
        return {}


class FakeLearner:
    def __init__(self, rng: random.Random, bounded: bool = True):
        self.rng, self.batches, self.bounded = rng, [], bounded  # bounded: no trained token older than k

    def update(self, batch: LearnerBatch, step):
        k = batch.max_staleness
        for vers, mask in zip(batch.versions, batch.train_mask, strict=True):
            assert len(vers) == len(mask)
            assert all(m is False for v, m in zip(vers, mask, strict=True) if v < 0), "a tool token trained"
            if self.bounded:
                assert all(step - v <= k for v, m in zip(vers, mask, strict=True) if m), (step, vers, mask, k)
            assert any(mask)
        self.batches.append(batch.request_ids)
        return {"behaviour_kl": self.rng.choice([0.0, 0.001, 0.05])}, {"w": torch.zeros(1)}

    def spans(self):
        return []


class ShuffledBackend(LocalBackend):
    """Results come back in a random order: any interleaving of engine and learner completions."""

    def __init__(self, rng: random.Random, learner: FakeLearner):
        self.rng, self.fake_learner = rng, learner

    def start_engine(self, cfg, weights, version, index=0):
        return FakeEngine(cfg, weights, version)

    def start_learner(self, cfg, run_root, checkpoint):
        return self.fake_learner

    def wait(self, futures, timeout=None):
        return [f for f in futures if self.rng.random() < 0.5] or [self.rng.choice(futures)]


class CheckedPipeline(Pipeline):
    def __init__(self, *args):
        self.metrics, self.issued = [], set()
        super().__init__(*args)

    def issue(self, wave, consumption):
        groups = super().issue(wave, consumption)
        self.issued |= {r.id for g in groups or [] for r in g.requests}
        return groups

    def _after_update(self, done, metrics):  # no evaluation or checkpoint: only the scheduling is under test
        self.metrics.append(metrics)


@pytest.fixture(scope="module")
def source():
    return make_task("addition")


@pytest.mark.train
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# tail batching on a data scheduler that draws less than a step (it used to wait forever for the rest)
@example(k=0, partial=False, inflight=False, overprovision=1.0, stale="drop", prompts=1, group=3, max_new=1,
         chunk=1, cap=1, steps=1, seed=0, data="difficulty_profile", engines=1, multi_turn=False, tail=True, migrate=False)  # fmt: skip
# tail batching with k=auto over three engines (CI found it stalled at update 3)
@example(k="auto", partial=False, inflight=False, overprovision=1.0, stale="drop", prompts=3, group=2, max_new=1,
         chunk=1, cap=2, steps=4, seed=1224, data="uniform", engines=3, multi_turn=False, tail=True, migrate=False)  # fmt: skip
@example(k="auto", partial=False, inflight=False, overprovision=1.5, stale="drop", prompts=2, group=2, max_new=1,
         chunk=1, cap=6, steps=5, seed=386, data="uniform", engines=2, multi_turn=False, tail=True, migrate=False)  # fmt: skip
# ... a spent group's spares still running are abandoned, not lost
@example(k="auto", partial=False, inflight=False, overprovision=1.5, stale="drop", prompts=2, group=2, max_new=3,
         chunk=1, cap=5, steps=5, seed=2, data="uniform", engines=1, multi_turn=False, tail=True, migrate=False)  # fmt: skip
# ... and a group is spent when fewer than two of the samples it keeps are left, spares aside
@example(k="auto", partial=False, inflight=False, overprovision=1.5, stale="drop", prompts=1, group=2, max_new=6,
         chunk=4, cap=1, steps=5, seed=0, data="coba", engines=1, multi_turn=False, tail=True, migrate=False)  # fmt: skip
@given(
    k=st.sampled_from([0, 1, 2, "auto"]),
    partial=st.booleans(),
    inflight=st.booleans(),
    overprovision=st.sampled_from([1.0, 1.5, 2.0]),
    stale=st.sampled_from(["drop", "mask", "keep"]),
    prompts=st.integers(1, 3),
    group=st.integers(2, 3),
    max_new=st.integers(1, 6),
    chunk=st.integers(1, 4),
    cap=st.integers(1, 8),
    steps=st.integers(1, 6),
    seed=st.integers(0, 10_000),
    data=st.sampled_from(["uniform", "coba", "difficulty_profile"]),
    engines=st.integers(1, 3),
    multi_turn=st.booleans(),
    tail=st.booleans(),
    migrate=st.booleans(),
)
def test_staleness_bound_and_sample_ledger(
    tokenizer,
    source,
    k,
    partial,
    inflight,
    overprovision,
    stale,
    prompts,
    group,
    max_new,
    chunk,
    cap,
    steps,
    seed,
    data,
    engines,
    multi_turn,
    tail,
    migrate,
):
    migrate = migrate and engines > 1 and not multi_turn
    consumption = "tail" if tail else "partial" if partial else "wave"
    cfg = config_from_dict(
        {
            "steps": steps,
            "task": {"env": "guess"} if multi_turn else {},
            "engine": {"max_concurrency": cap},
            "sampling": {"prompts_per_step": prompts, "group_size": group, "max_new_tokens": max_new},
            "algo": {"correction": "decoupled"},
            "pipeline": {
                "mode": "async",
                "backend": "local",
                "engine_chunk_steps": chunk,
                "num_engines": engines,
            },
            "schedule": {
                "data": data,
                "max_staleness": k,
                "staleness_args": {"k_max": 2} if k == "auto" else {},
                "consumption": consumption,
                "consumption_args": {
                    "tail": {"eta": overprovision},
                    "partial": {"overprovision": overprovision},
                }.get(consumption, {}),
                "weight_sync": "inflight" if inflight else "cut_resume" if partial else "drain",
                "stale": stale,
                "migrate": migrate,
            },
        }
    )
    rng = random.Random(seed)
    learner = FakeLearner(rng, bounded=stale != "keep")
    run = RunDir(Path("/nonexistent/schedrl-run"))  # no checkpoint: the learner would start from the config
    ctx = DataContext(source, cfg.seed, group, steps)  # variable group sizes unless uniform
    c = Components(
        cfg,
        run,
        torch.nn.Linear(1, 1),
        tokenizer,
        source,
        None,
        None,
        RewardScorer(source),
        None,
        0,
        data=make_scheduler(data, ctx),
    )
    pipe = CheckedPipeline(c, ShuffledBackend(rng, learner))
    pipe.run()

    assert pipe.loop.version == steps and len(learner.batches) == steps
    trained = [rid for batch in learner.batches for rid in batch]
    assert len(trained) == len(set(trained)), "a sample was trained on twice"
    issued = pipe.issued
    buffered = {
        r.id for g in pipe.loop.groups.values() for r in g.requests if r.sample_index not in g.dropped
    }
    dropped = set(pipe.loop.dropped)
    assert len(dropped) == len(pipe.loop.dropped)
    assert not (set(trained) & dropped) and not (set(trained) & buffered) and not (dropped & buffered)
    if tail:  # spares and the groups a short round did not keep are abandoned, counted
        assert len(set(trained) | dropped | buffered) + pipe.loop.abandoned == len(issued), (
            "a sample was lost"
        )
    else:
        assert set(trained) | dropped | buffered == issued, "a sample was lost"
        assert not pipe.loop.abandoned
    if k != "auto" and stale != "keep":
        assert all(m["staleness_max"] <= k for m in pipe.metrics)
    if stale == "keep":  # k bounds admission only: every sample trains, however old
        assert not dropped
    if k == 0 and not partial:
        assert not dropped and all(m["staleness_max"] == 0 for m in pipe.metrics)
