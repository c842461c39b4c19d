"""Context folding: an episode past its token budget summarises and goes on from the summary in a fresh
context; each segment is its own row for the learner, with the episode's advantage. Against the tiny
model on the built-in engine, in closed form for the batch, and through a run on the `recall` task."""

from __future__ import annotations

import asyncio

import pytest

from schedrl.config import AlgoConfig, ConfigError, config_from_dict
from schedrl.engine import EngineConfig, HFEngine
from schedrl.envs import make_env, make_task
from schedrl.envs.base import Task
from schedrl.envs.environment import Observation, StepResult
from schedrl.envs.ledger import encode
from schedrl.envs.recall import RecallEnv, RecallTask
from schedrl.orchestrate.buffer import Group, sample_from_dict, sample_to_dict
from schedrl.orchestrate.staleness import StalenessBound
from schedrl.orchestrate.update_batch import UpdateBatch
from schedrl.rollout.episodes import EpisodeRunner
from schedrl.rollout.folding import Fold
from schedrl.types import Request, Sample, SamplingParams

ROUNDS, ANSWER = 6, "ab"


class Rounds:
    """`ROUNDS` turns, each answered with `ANSWER` and a quarter; records what the model said."""

    stop_strings = ()

    def __init__(self, said: list[str]) -> None:
        self.said, self.turns = said, 0

    async def reset(self, task, seed: int) -> Observation:
        return Observation(task.prompt, "template")

    async def step(self, action: str) -> StepResult:
        self.said.append(action)
        self.turns += 1
        if self.turns == ROUNDS:
            return StepResult(None, 0.25, done=True)
        return StepResult(Observation(ANSWER, "env"), 0.25, done=False)

    async def close(self) -> None:
        return None


def _run(model, tokenizer, fold: Fold | None, max_model_len: int = 512, n: int = 3):
    task = Task("t0", "go:", "", domain="test")
    said: list[str] = []
    engine = HFEngine(model, tokenizer, EngineConfig(max_concurrency=4, max_model_len=max_model_len))
    runner = EpisodeRunner(
        engine, tokenizer, lambda: Rounds(said), max_turns=ROUNDS, max_turn_tokens=3, fold=fold
    )
    requests = [
        Request(f"e{i}", tuple(tokenizer("go:").input_ids), SamplingParams(60, seed=i), task_id="t0",
                group_id="g", sample_index=i)
        for i in range(n)
    ]  # fmt: skip
    try:
        return runner.run(requests, {"t0": task}), said, runner
    finally:
        runner.close()


def _summary(row: Sample) -> tuple[int, ...]:
    """The trained tokens that end a closed segment: its summary."""
    assert row.trained is not None
    k = len(row.trained)
    while k and row.trained[k - 1]:
        k -= 1
    return row.token_ids[k:]


def test_an_episode_past_its_budget_goes_on_from_the_summary(model, tokenizer):
    fold = Fold(tokens=20, ask=" S:", stop=";", summary_tokens=2, carry=" C:")
    samples, said, runner = _run(model, tokenizer, fold)
    ask, carry, answer = (encode(tokenizer, x) for x in (" S:", " C:", ANSWER))
    prompt = list(tokenizer("go:").input_ids)
    assert len(said) == ROUNDS * len(samples)  # every round reached the environment, no summary did
    assert not any(" S:" in a for a in said)
    for s in samples:
        rows = s.rows()
        assert len(rows) >= 2 and runner.folds >= len(rows) - 1
        for before, after in zip(rows, rows[1:], strict=False):
            summary = _summary(before)
            assert 1 <= len(summary) <= 2
            # a closed segment ends with the ask, then the summary the model wrote (trained) ...
            assert before.token_ids[-len(summary) - len(ask) : -len(summary)] == tuple(ask)
            # ... and the next starts from the episode's prompt, the carry, that summary as context and the
            # answer that waited
            assert after.prompt_ids == tuple(prompt + carry) + summary + tuple(answer)
            # each context stays near the budget: at most one more turn, the ask and the summary past it
            assert len(before.prompt_ids) + before.num_tokens <= 20 + len(answer) + 3 + len(ask) + 2
        # turns go on across segments, one model turn each (summaries included), and each summary turn
        # earned nothing itself: the rounds' rewards, in order, around zeros
        turns = [t for r in rows for t, m in zip(r.turns or (), r.trained or (), strict=True) if m]
        assert sorted(set(turns)) == list(range(ROUNDS + len(rows) - 1))
        assert s.turn_rewards is not None and len(s.turn_rewards) == ROUNDS + len(rows) - 1
        assert sorted(s.turn_rewards) == [0.0] * (len(rows) - 1) + [0.25] * ROUNDS
        assert all(r.reward == s.reward == pytest.approx(1.5) for r in rows)
        assert s.finish_reason == "stop"
        # the logged sample survives a checkpoint whole
        back = sample_from_dict(sample_to_dict(s))
        assert back.rows() == rows


def test_folding_lets_an_episode_outlive_the_engine_s_context(model, tokenizer):
    (plain,), said, _ = _run(model, tokenizer, None, max_model_len=24, n=1)
    assert plain.finish_reason == "length" and len(said) < ROUNDS  # the history stopped fitting
    (folded,), said, _ = _run(model, tokenizer, Fold(tokens=14, summary_tokens=2), max_model_len=24, n=1)
    assert folded.finish_reason == "stop" and len(said) == ROUNDS and folded.reward == pytest.approx(1.5)


def _sample(rid: str, reward: float, segments: tuple[Sample, ...] = (), version: int = 0) -> Sample:
    return Sample(
        rid, (1, 2), (3, 4, 5), (-0.1,) * 3, (version,) * 3, "stop", SamplingParams(8), task_id="t",
        group_id="g", sample_index=int(rid[-1]), reward=reward, trained=(True, False, True),
        turns=(len(segments),) * 3, turn_rewards=(0.0,) * len(segments) + (reward,), segments=segments,
    )  # fmt: skip


def test_every_segment_trains_with_its_episode_s_advantage():
    seg = _sample("a/segment0", 0.0)
    a = _sample("a1", 1.0, segments=(seg, seg))
    b = _sample("b0", 0.0)
    group = Group("g", Task("t", "p", "", domain="d"), [None, None], done={0: b, 1: a})
    batch = UpdateBatch.of([group], 0, StalenessBound(0), "drop", AlgoConfig())
    # two episodes, rewards 0 and 1: group advantages -+1/sqrt(2) (std normalised, unbiased)
    assert batch.adv.tolist() == pytest.approx([-(0.5**0.5), 0.5**0.5], abs=1e-3)
    lb = batch.learner_batch(0)
    assert lb.request_ids == ["b0", "a/segment0", "a/segment0", "a1"]
    assert lb.advantages == pytest.approx([-(0.5**0.5)] + [0.5**0.5] * 3, abs=1e-3)
    assert len(lb.train_mask) == 4
    assert batch.record_metrics(StalenessBound(0), 0)["fold/segments_mean"] == 2.0
    # per-turn credit: each row's tokens take their turn's advantage of the whole episode
    rtg = UpdateBatch.of([group], 0, StalenessBound(0), "drop", AlgoConfig(turn_credit="return_to_go"))
    assert rtg.learner_adv.shape[0] == 4


def test_a_folded_episode_whose_first_segment_is_too_stale_is_dropped_whole():
    from types import SimpleNamespace

    from schedrl.config import Schedule
    from schedrl.orchestrate.loop import Loop

    # at update 2 under k = 1: the episode's last segment (version 2) is fresh, its first (0) is not
    folded = _sample("a0", 1.0, segments=(_sample("a/segment0", 0.0, version=0),), version=2)
    fresh = [_sample(f"b{i}", float(i), version=2) for i in (1, 2)]
    loop = Loop(Schedule(max_staleness=1), 1, 3, SimpleNamespace(let_go=lambda spent: None))
    g = Group(
        "g",
        Task("t", "p", "", domain="d"),
        [None] * 3,
        admitted=True,
        done={0: folded, 1: fresh[0], 2: fresh[1]},
    )
    loop.groups["g"] = g
    loop.purge(2)
    assert g.dropped == [0] and loop.dropped == ["a0"] and sorted(g.done) == [1, 2]


def test_the_recall_task_and_its_rounds():
    src = RecallTask(rounds=5, change=0.5)
    tasks = src.sample("train", 50, seed=0)
    assert len({t.metadata["key"] for t in tasks}) > 30
    for t in tasks[:10]:
        assert src.reward(t, src.solution(t)) == 1.0

    async def play(task, actions):
        env = RecallEnv(src, round_reward=0.1)
        await env.reset(task, 0)
        return [await env.step(a) for a in actions]

    t = next(x for x in tasks if any(s is not None for s in x.metadata["sets"][1:]))
    values = t.answer.split(";")
    perfect = asyncio.run(play(t, [f"{v};" for v in values]))
    assert [r.reward for r in perfect] == pytest.approx([0.1] * 4 + [1.1])
    first_set = next(i for i, s in enumerate(t.metadata["sets"]) if i and s is not None)
    assert perfect[first_set - 1].observation.text == f"set {t.metadata['sets'][first_set]}:"
    # the first value held on through a change: that round and the outcome are lost
    stuck = asyncio.run(play(t, [f"{values[0]};"] * 5))
    assert stuck[-1].reward < 1.0 and sum(r.reward for r in stuck) < 0.5
    assert {x.metadata["key"] for x in src.sample("eval", 20, seed=0)}.isdisjoint(
        {x.metadata["key"] for x in src.sample("train", 500, seed=0)}
    )


def test_bad_fold_settings_are_named():
    base = {"task": {"name": "recall", "env": "recall"}}
    with pytest.raises(ConfigError, match="'task.fold' needs 'tokens'"):
        config_from_dict({"task": {**base["task"], "fold": {"ask": "x"}}})
    with pytest.raises(ConfigError, match="task.fold has no field 'budget'"):
        config_from_dict({"task": {**base["task"], "fold": {"tokens": 8, "budget": 3}}})
    with pytest.raises(ConfigError, match=r"'task.fold.tokens' must be an integer >= 1, got 0"):
        config_from_dict({"task": {**base["task"], "fold": {"tokens": 0}}})
    with pytest.raises(ConfigError, match="'task.fold.stop' must be a non-empty string"):
        config_from_dict({"task": {**base["task"], "fold": {"tokens": 8, "stop": ""}}})
    with pytest.raises(ConfigError, match="needs a multi-turn task.env"):
        config_from_dict({"task": {"name": "recall", "fold": {"tokens": 8}}})
    with pytest.raises(ValueError, match="rounds"):
        make_task("recall", rounds=1)
    with pytest.raises(ValueError, match="round_reward"):
        make_env("recall", RecallTask(), round_reward=1.0)


@pytest.mark.train
def test_a_folded_run_trains_its_segments(tmp_path):
    import schedrl
    from schedrl.training.run_dir import read_metrics

    cfg = {
        "steps": 2, "save_every": 0, "out_dir": str(tmp_path), "name": "fold", "sft": {"steps": 5},
        "eval": {"tasks": 0}, "min_start_reward": -1.0, "logging": {"backends": ["jsonl"]},
        "task": {"name": "recall", "args": {"rounds": 6}, "env": "recall", "max_turns": 6,
                 "fold": {"tokens": 24, "summary_tokens": 2}},
        "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 30},
    }  # fmt: skip
    schedrl.train(cfg)
    rows = [r for r in read_metrics(tmp_path / "fold" / "metrics.jsonl") if "loss" in r]
    assert len(rows) == 2 and all(r["fold/segments_mean"] > 1.0 for r in rows)


class Delegates:
    """The main agent's first turn opens a sub-agent, whose turn returns `" got x:"`; the main agent's
    next turn ends the episode. With `bad`, the first answer returns from a sub-agent never opened."""

    stop_strings = ()

    def __init__(self, bad: bool = False, end_inside: bool = False) -> None:
        self.bad, self.end_inside, self.turns = bad, end_inside, 0

    async def reset(self, task, seed: int) -> Observation:
        return Observation(task.prompt, "template")

    async def step(self, action: str) -> StepResult:
        self.turns += 1
        if self.turns == 1 and self.bad:
            return StepResult(Observation(" got x:", "env"), 0.0, False, context="return")
        if self.turns == 1:
            return StepResult(Observation("sub:", "env"), 0.1, False, context="branch")
        if self.turns == 2 and self.end_inside:
            return StepResult(None, 1.0, done=True)
        if self.turns == 2:
            return StepResult(Observation(" got x:", "env"), 0.2, False, context="return")
        return StepResult(None, 1.0, done=True)

    async def close(self) -> None:
        return None


def _delegate(model, tokenizer, budget=20, **kw):
    task = Task("t0", "go:", "", domain="test")
    runner = EpisodeRunner(HFEngine(model, tokenizer), tokenizer, lambda: Delegates(**kw), max_turn_tokens=3)
    params = SamplingParams(budget, seed=0, ignore_eos=budget < 20)
    r = Request("e0", tuple(tokenizer("go:").input_ids), params, task_id="t0", group_id="g")
    try:
        return runner.run([r], {"t0": task})[0], runner
    finally:
        runner.close()


def test_a_sub_agent_runs_in_a_context_of_its_own_and_returns_to_the_main_one(model, tokenizer):
    s, _ = _delegate(model, tokenizer)
    (sub,) = s.segments
    # the sub-agent's context: its own prompt and its one model turn, nothing of the main agent's
    assert sub.prompt_ids == tuple(tokenizer("sub:").input_ids) and sub.trained == (True,) * sub.num_tokens
    # the main context: its prompt, its first turn, the sub-agent's answer as context, its last turn
    got = encode(tokenizer, " got x:")
    assert s.prompt_ids == tuple(tokenizer("go:").input_ids)
    assert s.trained is not None and s.turns is not None
    first = s.trained.index(False)
    assert s.token_ids[first : first + len(got)] == tuple(got)
    assert s.trained == (True,) * first + (False,) * len(got) + (True,) * (s.num_tokens - first - len(got))
    # model turns in order across contexts: main 0, the sub-agent's 1, main 2; their rewards in order
    assert (
        set(sub.turns or ()) == {1}
        and set(s.turns[:first]) == {0}
        and set(s.turns[first + len(got) :]) == {2}
    )
    assert s.turn_rewards == pytest.approx((0.1, 0.2, 1.0)) and s.reward == pytest.approx(1.3)
    assert [r.reward for r in s.rows()] == pytest.approx([1.3, 1.3])


def test_an_episode_that_ends_inside_a_sub_agent_keeps_every_context(model, tokenizer):
    s, _ = _delegate(model, tokenizer, end_inside=True)
    (main,) = s.segments  # the main context, left waiting, is a segment; the sub-agent's is the sample
    assert main.prompt_ids == tuple(tokenizer("go:").input_ids)
    assert s.prompt_ids == tuple(tokenizer("sub:").input_ids) and s.reward == pytest.approx(1.1)


def test_a_sub_agent_that_never_got_a_turn_is_no_segment(model, tokenizer):
    s, _ = _delegate(model, tokenizer, budget=3)  # the first turn spends the whole budget, then branches
    assert s.segments == () and s.finish_reason == "length"
    assert (
        s.prompt_ids == tuple(tokenizer("go:").input_ids) and s.num_tokens == 3 and s.trained == (True,) * 3
    )


def test_a_return_with_no_sub_agent_open_ends_the_episode_and_is_counted(model, tokenizer):
    s, runner = _delegate(model, tokenizer, bad=True)
    assert s.reward == 0.0 and runner.env_errors == 1 and "none is open" in (runner.last_env_error or "")


def test_the_engine_s_context_is_a_config_field():
    from schedrl.orchestrate.build import engine_config

    assert engine_config(config_from_dict({"engine": {"max_model_len": 48}})).max_model_len == 48
    with pytest.raises(ConfigError, match=r"'engine.max_model_len' must be an integer >= 2 or null, got 1"):
        config_from_dict({"engine": {"max_model_len": 1}})
