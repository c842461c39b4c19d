"""Long-tail migration (JigsawRL) in the real engine fleet: which requests move, and that a moved request
continues exactly where it was cut, on the other engine."""

from __future__ import annotations

import pytest
import torch

from schedrl.config import config_from_dict
from schedrl.distributed import EngineWorker
from schedrl.distributed.backend import LocalBackend
from schedrl.distributed.workers import cpu_weights
from schedrl.engine.migration import migrants
from schedrl.engine.preemption import Running
from schedrl.envs import make_task
from schedrl.orchestrate.build import load_policy
from schedrl.orchestrate.fleet import EngineFleet
from schedrl.rollout import group_requests
from schedrl.types import Request, SamplingParams


def _running(rid: str, generated: int, admitted: int) -> Running:
    return Running(Request(rid, (1,), SamplingParams(8)), generated, admitted)


def test_the_last_waiting_go_first_then_the_running_that_generated_least():
    running = [_running("a", 5, 0), _running("b", 2, 1), _running("c", 2, 2), _running("d", 9, 3)]
    assert migrants(["w1", "w2"], running, 1) == ["w2"]
    assert migrants(["w1", "w2"], running, 4) == ["w2", "w1", "c", "b"]  # c admitted after b: c first
    # one running request always stays
    assert migrants([], running, 10) == ["c", "b", "a"]
    assert migrants([], running[:1], 3) == [] and migrants([], [], 2) == []


@pytest.mark.train
def test_a_dry_engine_takes_half_the_tail_and_the_moved_requests_continue_exactly(tokenizer):
    cfg = config_from_dict(
        {"pipeline": {"mode": "async", "backend": "local", "num_engines": 2}, "schedule": {"migrate": True}}
    )
    weights = cpu_weights(load_policy(config_from_dict({}), None, torch.device("cpu"))[0])
    task = make_task("sort").sample("train", 2, seed=1)
    long = group_requests(
        [task[0]], tokenizer, SamplingParams(16, temperature=0.0, ignore_eos=True), 4, seed=0, step=0
    )
    short = group_requests([task[1]], tokenizer, SamplingParams(2, temperature=0.0, ignore_eos=True), 4, seed=0, step=1)  # fmt: skip
    alone = EngineWorker(cfg, weights, 0)
    alone.add(long + short)
    whole = {s.request_id: s for s in alone.run(100)}

    finished, moves = {}, []

    def on_samples(samples):
        for s in samples:
            fleet.release(s.request_id)
            if s.finish_reason != "aborted":
                finished[s.request_id] = s

    def on_moved(index, samples):
        moves.append((index, sorted(s.request_id for s in samples)))
        assert all(0 < s.num_tokens < 16 for s in samples)  # cut while running, with their prefixes
        fleet.send([Request.resume(s) for s in samples], to=index)

    fleet = EngineFleet(LocalBackend(), cfg, weights, 0, 2, on_samples, lambda i, g: None, on_moved)
    fleet.send(long + short)
    assert {rid: e for rid, (_, e) in fleet.in_engine.items()} == {
        **{r.id: 0 for r in long},
        **{r.id: 1 for r in short},
    }
    while not fleet.idle:
        fleet.collect(fleet.keep_running(1))
        fleet.rebalance()
    # engine 1 ran dry after the short group's 2 tokens and took 2 of the 4 long requests (the latest
    # admitted: all four generated the same); they finished there, token for token as uninterrupted
    assert moves == [(1, sorted(r.id for r in long[2:]))] and fleet.migrated == 2
    assert finished.keys() == whole.keys()
    for rid, s in whole.items():
        assert finished[rid].token_ids == s.token_ids and finished[rid].finish_reason == s.finish_reason
        assert finished[rid].logprobs == pytest.approx(s.logprobs, abs=1e-5)
