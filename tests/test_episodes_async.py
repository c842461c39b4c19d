"""Multi-turn episodes in the asynchronous pipeline: the `EpisodeEngine` behind the engine protocol, cut
mid-turn and resumed exactly, and training runs on threads with tools."""

from __future__ import annotations

import pytest
import torch

from schedrl.config import config_from_dict
from schedrl.engine import EngineConfig, HFEngine
from schedrl.envs import make_env, make_task
from schedrl.orchestrate.run import train
from schedrl.rollout.episode_engine import EpisodeEngine
from schedrl.rollout.episodes import EpisodeRunner
from schedrl.rollout.tool_wait import Pin, Release
from schedrl.training.run_dir import RunDir, read_metrics
from schedrl.types import Request, SamplingParams


def _episodes(model, tokenizer, policy, park_slots=0):
    source = make_task("guess", high=15)
    engine = HFEngine(model, tokenizer, EngineConfig(max_concurrency=3, park_slots=park_slots))
    runner = EpisodeRunner(
        engine, tokenizer, lambda: make_env("guess", source, max_guesses=4), stop=(";",), max_turns=4,
        max_turn_tokens=5, tool_wait=policy,
    )  # fmt: skip
    tasks = source.sample("train", 5, seed=1)
    reqs = [
        Request(
            f"e{i}",
            tuple(tokenizer(t.prompt).input_ids),
            SamplingParams(16, seed=i),
            task_id=t.id,
            group_id="g",
            sample_index=i,
        )  # fmt: skip
        for i, t in enumerate(tasks)
    ]
    eng = EpisodeEngine(runner)
    eng.set_tasks({t.id: t for t in tasks})
    return eng, reqs


def _uncut(model, tokenizer, policy) -> dict:
    """The episodes' samples, by request id, run to their end with nothing cut or discarded."""
    plain, reqs = _episodes(model, tokenizer, policy, park_slots=3)
    try:
        return {s.request_id: s for s in plain.generate(reqs)}
    finally:
        plain.runner.close()


@pytest.mark.parametrize("policy", [Release(), Pin(Pin.Args(prior_wait_s=5.0))], ids=["release", "pin"])
def test_episodes_cut_at_any_step_resume_exactly(model, tokenizer, policy):
    ref = _uncut(model, tokenizer, policy)
    cut, reqs = _episodes(model, tokenizer, policy, park_slots=3)
    try:
        for r in reqs:
            cut.add(r)
        done, cuts, steps = {}, 0, 0
        while cut.has_unfinished():
            steps += 1
            for s in cut.step():
                done[s.request_id] = s
            if steps % 3 == 0:  # abort everything, mid-turn or mid-wait, as a checkpoint or cut_resume does
                ids = cut.waiting_ids + cut.running_ids
                aborted = [cut.abort(i) for i in ids]
                assert all(a.finish_reason == "aborted" and not a.token_ids for a in aborted)
                assert not cut.has_unfinished() or not ids
                cuts += len(ids)
                by_id = {r.id: r for r in reqs}
                for i in ids:  # the pipeline sends the original request again
                    cut.add(by_id[i])
    finally:
        cut.runner.close()
    assert cuts > 0 and set(done) == set(ref)
    for rid, s in done.items():
        r = ref[rid]
        assert s.token_ids == r.token_ids and s.trained == r.trained and s.turns == r.turns
        assert s.reward == r.reward and s.turn_rewards == r.turn_rewards
        assert torch.allclose(torch.tensor(s.logprobs), torch.tensor(r.logprobs), atol=1e-4)


@pytest.mark.parametrize("policy", [Release(), Pin(Pin.Args(prior_wait_s=5.0))], ids=["release", "pin"])
def test_discarded_episodes_end_for_good_and_the_rest_run_as_alone(model, tokenizer, policy):
    """Tail batching abandons spare episodes (`EngineWorker.abort` discards them): one with a model turn in
    the engine and one waiting on its environment end with no sample, their environments close, the
    engine keeps nothing of theirs (a pinned one's parked cache goes), and the others finish as in a run
    without them."""
    ref = _uncut(model, tokenizer, policy)
    eng, reqs = _episodes(model, tokenizer, policy, park_slots=3)
    closed: list[str] = []
    make = eng.runner.make_env

    def counted():
        env = make()
        close = env.close

        async def counting_close():
            closed.append("x")
            await close()

        env.close = counting_close
        return env

    eng.runner.make_env = counted
    try:
        for r in reqs:
            eng.add(r)
        done, gone = {}, []
        while eng.has_unfinished():
            for s in eng.step():
                done[s.request_id] = s
            running = [i for i in eng.running_ids if i not in gone]
            waiting = [i for i in eng.waiting_ids if i not in gone and i not in running]
            if len(gone) < 2 and running and waiting and eng.runner.engine.num_running:
                for i in (running[0], waiting[0]):
                    s = eng.discard(i)
                    assert s is not None and s.finish_reason == "aborted" and not s.token_ids
                    gone.append(i)
                assert eng.discard(gone[0]) is None  # gone already
        assert len(gone) == 2 and not set(gone) & set(done)
        assert set(done) == set(ref) - set(gone)
        for rid, s in done.items():
            assert s.token_ids == ref[rid].token_ids and s.reward == ref[rid].reward
        assert not eng.runner._active and not eng.runner._in_engine and not eng.runner._waiting
        inner = eng.runner.engine
        assert inner.num_running == 0 and inner.num_waiting == 0
        assert getattr(inner, "num_cached_tokens", 0) == 0  # no parked cache of a discarded episode left
    finally:
        eng.runner.close()
    assert len(closed) == len(reqs)  # every environment closed, the discarded ones too
    assert eng.runner.episodes_ended == len(reqs) - 2


def test_an_unknown_task_is_refused_with_its_id(model, tokenizer):
    eng, reqs = _episodes(model, tokenizer, Release())
    eng.set_tasks({})
    try:
        with pytest.raises(ValueError, match="episode 'e0': task 'guess-"):
            eng.add(reqs[0])
    finally:
        eng.runner.close()


CALC = {
    "name": "calc",
    "args": {"min_digits": 2, "max_digits": 2},
    "env": "tools",
    "env_args": {"tools": ["schedrl.envs.calc:calc"]},
    "max_turns": 3,
}


@pytest.mark.train
@pytest.mark.parametrize(
    "pipeline",
    [
        {"max_staleness": 1, "weight_sync": "inflight"},
        {
            "max_staleness": 1,
            "consumption": "partial",
            "weight_sync": "cut_resume",
            "consumption_args": {"overprovision": 1.5},
        },
    ],
    ids=["inflight", "partial_cut_resume"],
)
def test_asynchronous_training_with_tools_on_threads(tmp_path, pipeline):
    cfg = config_from_dict(
        {
            "task": CALC,
            "engine": {"park_slots": 8},
            "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 24},
            "algo": {"correction": "decoupled", "turn_credit": "return_to_go", "turn_discount": 0.9},
            "pipeline": {"mode": "async", "backend": "threads"},
            "schedule": {"tool_wait": "pin", "tool_wait_args": {"priority": "progress"}, **pipeline},
            "steps": 3,
            "save_every": 2,
            "sft": {"steps": 20},
            "eval": {"tasks": 4, "k": 2},
            "min_start_reward": 0.0,
        }
    )
    run = RunDir.create(tmp_path, "calc_async")
    result = train(cfg, run)
    rows = [r for r in read_metrics(run.metrics_path) if "reward_mean" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    assert all(r["staleness_max"] <= 1 for r in rows)
    assert all(r["turns_mean"] >= 1 and r["masked_tokens"] > 0 for r in rows)  # episodes, with tool tokens
    assert "greedy_acc" in result["eval_after"]
    # the engine workers' episode counts, as the synchronous loop logs them: tool outcomes (cumulative)
    # and the prefill and reuse of each update
    calls = [sum(v for k, v in r.items() if k.startswith("tool/")) for r in rows]
    assert calls[0] > 0 and calls == sorted(calls)
    assert all(r["prefill_tokens"] >= 0 and r["kv_reused_tokens"] >= 0 and "env_errors" in r for r in rows)
    assert sum(r["prefill_tokens"] for r in rows) > 0  # engine work between updates, not in lockstep
