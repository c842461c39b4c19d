"""Tail batching (`schedule.consumption: tail`): the policy's rounds on hand-made groups, then the
pipeline on the tiny model, against closed-form counts."""

from __future__ import annotations

import pytest

from schedrl.api import resolve_config
from schedrl.config import ConfigError, config_from_dict
from schedrl.envs import Task
from schedrl.orchestrate.buffer import Group
from schedrl.orchestrate.consumption import CONSUMPTION, TailBatching
from schedrl.types import Request, Sample, SamplingParams


def _task(i: int) -> Task:
    return Task(id=f"t{i}", prompt=f"p{i}", answer="a", domain="d")


def _draw(log: list[int]):
    counter = iter(range(1000))

    def draw(samples: int) -> list[tuple[Task, int]]:
        log.append(samples)
        return [(_task(next(counter)), 2) for _ in range(samples // 2)]

    return draw


def _groups(plan, wave: int) -> list[Group]:
    out = []
    for i, (task, n, need) in enumerate(plan):
        reqs = [
            Request(f"{wave}/{i}/{g}", (1,), SamplingParams(), task_id=task.id, sample_index=g)
            for g in range(n)
        ]
        out.append(Group(f"{wave}/{i}", task, reqs, wave=wave, admitted=True, need=0 if need == n else need))
    return out


def _finish(group: Group, index: int) -> None:
    r = group.requests[index]
    group.done[index] = Sample(r.id, (1,), (2,), (0.0,), (0,), "stop", r.params, sample_index=index)


def test_a_short_round_keeps_the_first_groups_to_finish_and_defers_the_rest():
    tail = CONSUMPTION.build("tail", {"eta": 1.5}, 8)  # 8 samples a step: 4 prompts x 2; eta 1.5
    drawn: list[int] = []
    plan = tail.plan(_draw(drawn), 0)
    assert drawn == [12]  # eta x a step's samples drawn: 6 prompts
    assert [(n, need) for _, n, need in plan] == [(3, 2)] * 6  # 3 responses each, 2 needed
    assert tail.plan(_draw(drawn), 1) is None  # the next round waits for this one's take
    queue = _groups(plan, 0)
    for g in (queue[4], queue[1], queue[5]):  # three prompts finish two responses each, in this order,
        _finish(g, 2)  # each seen by a take (the pipeline asks after every batch of results)
        _finish(g, 0)
        assert tail.take(queue) is None  # at most 6 samples of 8
    _finish(queue[0], 1)  # one response only: not ready
    _finish(queue[3], 1)
    _finish(queue[3], 0)
    taken = tail.take(queue)
    assert [g.id for g in taken] == ["0/4", "0/1", "0/5", "0/3"]
    dropped = tail.drop(queue)
    assert [g.id for g in dropped] == ["0/0", "0/2"] and tail.drop(queue) == []
    assert [t.id for t, _ in tail.deferred] == ["t0", "t2"]
    assert tail.metrics() == {"tail_long_round": 0.0, "tail_deferred_prompts": 2.0}
    taken[0].trim()  # the first two to finish are the ones trained
    assert list(taken[0].done) == [2, 0]


def test_a_long_round_runs_the_deferred_prompts_whole_once_they_fill_a_step():
    # 4 prompts x 2 a step; eta 1.5: 6 prompts x 3 responses
    tail = TailBatching(8, TailBatching.Args(eta=1.5))
    draw = _draw([])
    for wave in (0, 1):  # two short rounds defer two prompts each: 4 + 4 samples
        queue = _groups(tail.plan(draw, wave), wave)
        for g in queue[:4]:
            _finish(g, 0)
            _finish(g, 2)
        assert len(tail.take(queue)) == 4
        assert len(tail.drop(queue)) == 2
    assert [t.id for t, _ in tail.deferred] == ["t4", "t5", "t10", "t11"]
    plan = tail.plan(draw, 2)  # deferred hold a step's 8 samples: a long round of all four, no spares
    assert [(t.id, n, need) for t, n, need in plan] == [
        ("t4", 2, 2),
        ("t5", 2, 2),
        ("t10", 2, 2),
        ("t11", 2, 2),
    ]
    queue = _groups(plan, 2)
    for g in queue:
        _finish(g, 0)
    for g in queue[:3]:
        _finish(g, 1)
    assert tail.take(queue) is None  # a long round waits for its last token
    _finish(queue[3], 1)
    assert tail.take(queue) == queue and tail.drop(queue) == []
    assert tail.metrics() == {"tail_long_round": 1.0, "tail_deferred_prompts": 0.0}
    again = TailBatching(8, TailBatching.Args(eta=1.5))
    again.load_state_dict({**tail.state_dict(), "deferred": [[vars(_task(99)), 2]]})
    assert again.deferred == [(_task(99), 2)] and again.open_wave is None


def test_eta_below_one_is_refused():
    with pytest.raises(ValueError, match="argument 'eta' must be >= 1, got 0.5"):
        TailBatching(4, TailBatching.Args(eta=0.5))
    with pytest.raises(ConfigError, match="schedule.consumption.*'tail'.*'eta'.*0.5"):
        resolve_config(
            {
                "pipeline": {"mode": "async"},
                "schedule": {"consumption": "tail", "consumption_args": {"eta": 0.5}},
            }
        )


@pytest.mark.train
def test_the_pipeline_runs_short_rounds_then_the_deferred_long_round_and_resumes_it(tmp_path):
    """6 prompts x 4 a step at eta 1.5: a short round samples 9 prompts x 6, keeps the first 6 prompts
    with 4 finished, defers 3 (12 samples); after two short rounds the third is the long round of those
    6 deferred prompts. Stopped after two steps and resumed, the long round runs from the checkpoint."""
    import json

    from schedrl.orchestrate.run import train
    from schedrl.training.checkpoint import latest_checkpoint
    from schedrl.training.run_dir import RunDir, read_metrics

    def cfg(steps):
        return config_from_dict(
            {
                "task": {"name": "sort", "args": {"min_len": 2, "max_len": 3}},
                "sft": {"steps": 30, "batch_size": 32, "lr": 1e-3},
                "sampling": {"prompts_per_step": 6, "group_size": 4, "max_new_tokens": 4, "temperature": 1.2},
                "eval": {"tasks": 4, "k": 1},
                "min_start_reward": 0.0,
                "steps": steps,
                "save_every": 2,
                "pipeline": {"mode": "async", "backend": "local"},
                "schedule": {"consumption": "tail", "consumption_args": {"eta": 1.5}},
                "out_dir": str(tmp_path),
                "name": "tail",
            }
        )

    run = RunDir.create(str(tmp_path), "tail")
    train(cfg(2), run)
    saved = json.loads((latest_checkpoint(run.ckpt_dir) / "state.json").read_text())["pipeline"]
    deferred = [t["id"] for t, _ in saved["consumption"]["deferred"]]
    planned = [g["task"]["id"] for g in saved["groups"]]  # the long round, planned at the last take
    assert len(deferred) + len(planned) == 6 and saved["abandoned"] == 2 * (9 * 6 - 6 * 4)
    assert all(len(g["requests"]) == 4 and g["need"] == 0 for g in saved["groups"])  # no spares
    train(cfg(3), run, resume=True)
    rows = [r for r in read_metrics(run.metrics_path) if "reward_mean" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["tail_long_round"] for r in rows] == [0.0, 0.0, 1.0]
    assert [r["tail_deferred_prompts"] for r in rows] == [3.0, 6.0, 0.0]
    assert all(r["data/group_size_mean"] == 4.0 and r["batch_groups"] == 6.0 for r in rows)
    assert all(r["staleness_max"] == 0.0 for r in rows)  # every round on-policy
    final = json.loads((latest_checkpoint(run.ckpt_dir) / "state.json").read_text())["pipeline"]
    long_round = final["consumed"][-6:]
    assert sorted(gid.split("/")[1] for gid in long_round) == ["2"] * 6  # wave 2's groups
    assert final["abandoned"] == 2 * (9 * 6 - 6 * 4)  # the long round had no spares


def test_a_draw_smaller_than_asked_keeps_the_steps_share_of_it():
    """A data scheduler may draw fewer samples than asked: at eta 1 the round then keeps all it drew."""
    tail = TailBatching(6, TailBatching.Args(eta=1.0))
    plan = tail.plan(lambda samples: [(_task(0), 2), (_task(1), 2)], 0)  # 4 samples of the 6 asked
    queue = _groups(plan, 0)
    for g in queue:
        _finish(g, 0)
        _finish(g, 1)
    assert tail.take(queue) == queue  # a target of 6 would wait forever


def test_groups_dropped_as_too_stale_leave_the_round_short_not_stalled():
    """A shrinking `auto` k drops a round's groups as too stale (`_purge_stale` deletes them from the
    buffer): the round keeps what is left, and a round with nothing left ends so the next is planned.
    Hypothesis found the stall: k auto, eta 1, three engines."""
    tail = TailBatching(6, TailBatching.Args(eta=1.0))  # 3 prompts x 2, no spares
    queue = _groups(tail.plan(_draw([]), 0), 0)
    for g in queue:
        _finish(g, 0)
        _finish(g, 1)
    left = queue[1:]  # one group purged: 4 of the 6 samples remain
    assert tail.take(left) == left
    assert tail.plan(_draw([]), 1) is not None
    assert tail.take([]) is None  # every group of round 1 purged: the round is over, nothing to take
    assert tail.plan(_draw([]), 2) is not None  # and the next round is planned


def test_multi_turn_episodes_are_discarded_with_their_environments(tmp_path):
    """Tail batching on the guessing game: the spare episodes and the deferred groups' episodes are
    discarded in their engine (environments closed, nothing left suspended), counted as abandoned in
    closed form; two short rounds defer 2 prompts each, so the third update is the long round."""
    from schedrl.distributed.backend import LocalBackend
    from schedrl.orchestrate.build import build
    from schedrl.orchestrate.pipeline import Pipeline
    from schedrl.training.run_dir import RunDir

    cfg = config_from_dict(
        {
            "task": {
                "name": "guess",
                "args": {"high": 15},
                "env": "guess",
                "env_args": {"max_guesses": 3},
                "max_turns": 3,
                "max_observation_tokens": 4,
            },
            "sft": {"steps": 10},
            "sampling": {"prompts_per_step": 4, "group_size": 2, "max_new_tokens": 12},
            "eval": {"tasks": 2, "k": 1},
            "min_start_reward": 0.0,
            "steps": 3,
            "engine": {"max_concurrency": 4},  # episodes queue: some are still waiting when a round ends
            "pipeline": {"mode": "async", "backend": "local", "engine_chunk_steps": 1},
            "schedule": {"consumption": "tail", "consumption_args": {"eta": 1.5}},
        }
    )
    c = build(cfg, RunDir.create(str(tmp_path), "tail_mt"))
    rows: list[dict] = []
    pipe = Pipeline(c, LocalBackend(), on_step=lambda step, m: rows.append(m))
    pipe.run()
    assert [r["tail_long_round"] for r in rows] == [0.0, 0.0, 1.0]
    assert pipe.loop.abandoned == 2 * (6 * 3 - 4 * 2)  # each short round: 6 prompts x 3 launched, 4 x 2 kept
    buffered = {r.id for g in pipe.loop.groups.values() for r in g.requests}
    assert sum(worker.engine.runner.discarded for worker in pipe.engines) > 0
    for worker in pipe.engines:
        runner = worker.engine.runner
        assert set(runner._active) <= buffered  # every abandoned episode is gone, none suspended
        runner.close()
        assert all(f.done() for f in runner._closing)
