"""Multi-turn episodes on the built-in engine: token in, token out across turns, tool tokens never trained,
failures end an episode (never the run), and a synchronous training run with a calculator tool."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from schedrl.config import config_from_dict
from schedrl.engine import EngineConfig, HFEngine
from schedrl.envs import make_env, make_task
from schedrl.envs.environment import Observation, StepResult
from schedrl.envs.ledger import encode
from schedrl.orchestrate.run import train
from schedrl.rollout.episodes import EpisodeRunner
from schedrl.training.batch import collate
from schedrl.training.run_dir import RunDir, read_metrics
from schedrl.types import Request, SamplingParams


class OneCall:
    """Answers the first turn with a tool result, scores the second by its length, as a tool loop does."""

    stop_strings = ()

    def __init__(self, observation: str = "[42]", fail: bool = False) -> None:
        self.observation, self.fail, self.turns = observation, fail, 0

    async def reset(self, task, seed: int) -> Observation:
        return Observation(task.prompt, "template")

    async def step(self, action: str) -> StepResult:
        self.turns += 1
        await asyncio.sleep(0)  # the environment yields, as a real tool would
        if self.fail:
            raise ConnectionError("the tool server went away")
        if self.turns == 1:
            return StepResult(Observation(self.observation, "tool"), None, done=False)
        return StepResult(None, 1.0, done=True)

    async def close(self) -> None:
        return None


class Recording(HFEngine):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.added: list[Request] = []
        self.finished = []

    def add(self, request: Request) -> None:
        self.added.append(request)
        super().add(request)

    def step(self):
        out = super().step()
        self.finished += out
        return out


def _requests(tokenizer, tasks, budget=12):
    return [
        Request(
            f"e{i}",
            tuple(tokenizer(t.prompt).input_ids),
            SamplingParams(budget, seed=i),
            task_id=t.id,
            group_id=f"g{i}",
            sample_index=0,
        )
        for i, t in enumerate(tasks)
    ]


def test_turns_are_token_in_token_out_and_tool_tokens_are_context(model, tokenizer):
    tasks = make_task("addition").sample("train", 3, seed=0)
    engine = Recording(model, tokenizer, EngineConfig(max_concurrency=4))
    runner = EpisodeRunner(engine, tokenizer, lambda: OneCall(), max_turns=3)
    try:
        samples = runner.run(_requests(tokenizer, tasks, budget=40), {t.id: t for t in tasks})
    finally:
        runner.close()
    tool = encode(tokenizer, "[42]")
    by_turn = {r.id: r for r in engine.added}
    done = {s.request_id: s for s in engine.finished}
    for i, s in enumerate(samples):
        first, second = done[f"e{i}/turn0"], done[f"e{i}/turn1"]
        # turn 1's prompt is the prompt, turn 0's tokens exactly as sampled, then the tool's tokens
        assert by_turn[f"e{i}/turn1"].prompt_ids == s.prompt_ids + first.token_ids + tuple(tool)
        assert by_turn[f"e{i}/turn1"].params.max_new_tokens == 40 - first.num_tokens  # what is left
        assert s.token_ids == first.token_ids + tuple(tool) + second.token_ids
        assert s.logprobs == first.logprobs + (0.0,) * len(tool) + second.logprobs
        assert s.trained == (True,) * first.num_tokens + (False,) * len(tool) + (True,) * second.num_tokens
        assert s.reward == 1.0 and sum(s.trained) <= 40  # one budget for the whole episode
        batch = collate(
            [s.prompt_ids], [s.token_ids], tokenizer.pad_token_id, [s.logprobs], train_mask=[s.trained]
        )
        assert int(batch.mask.sum()) == sum(s.trained)  # the loss sees the model's tokens only
    assert runner.last_turns == [2, 2, 2]


def test_a_failing_environment_ends_its_episode_with_reward_zero(model, tokenizer):
    tasks = make_task("addition").sample("train", 2, seed=1)
    runner = EpisodeRunner(HFEngine(model, tokenizer), tokenizer, lambda: OneCall(fail=True))
    try:
        samples = runner.run(_requests(tokenizer, tasks), {t.id: t for t in tasks})
    finally:
        runner.close()
    assert [s.reward for s in samples] == [0.0, 0.0] and runner.env_errors == 2
    assert all(s.token_ids and all(s.trained) for s in samples)  # the first turn is kept


def test_a_history_past_the_context_ends_with_length(model, tokenizer):
    tasks = make_task("addition").sample("train", 1, seed=2)
    engine = HFEngine(model, tokenizer, EngineConfig(max_model_len=40))
    runner = EpisodeRunner(
        engine, tokenizer, lambda: OneCall(observation="9" * 60), max_observation_tokens=60
    )
    try:
        (s,) = runner.run(_requests(tokenizer, tasks, budget=8), {t.id: t for t in tasks})
    finally:
        runner.close()
    assert s.finish_reason == "length" and s.reward == 0.0 and not engine.has_unfinished()


def test_calc_tool_trace_is_scored_on_its_final_answer():
    source = make_task("calc", min_digits=3, max_digits=3)
    (task,) = source.sample("train", 1, seed=0)
    env = make_env("tools", source, tools=["schedrl.envs.calc:calc"], parser="compact")
    a, b = task.prompt.removesuffix("=").split("*")

    async def episode(final: str):
        await env.reset(task, 0)
        called = await env.step(f"<<calc {a}*{b}>>")
        answered = await env.step(final)
        return called, answered

    called, answered = asyncio.run(episode(task.answer))
    assert called.observation == Observation(f"[{int(a) * int(b)}]", "tool") and called.info == {
        "tools": ["ok"]
    }
    assert answered.done and answered.reward == 1.0
    assert asyncio.run(episode("123"))[1].reward == 0.0
    assert source.reward(task, source.solution(task)) == 1.0 and env.stop_strings == (">>",)


@pytest.mark.train
@pytest.mark.parametrize("tool_wait", ["release", "pin"])
def test_synchronous_training_with_a_calculator_tool(tmp_path, tool_wait):
    cfg = config_from_dict(
        {
            "task": {
                "name": "calc",
                "args": {"min_digits": 2, "max_digits": 2},
                "env": "tools",
                "env_args": {"tools": ["schedrl.envs.calc:calc"]},
                "max_turns": 3,
            },
            "schedule": {
                "tool_wait": tool_wait,
                "tool_wait_args": {"priority": "progress"} if tool_wait == "pin" else {},
            },
            "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 24},
            "steps": 2,
            "save_every": 0,
            "sft": {"steps": 20},
            "eval": {"tasks": 4, "k": 2},
            "min_start_reward": 0.0,
        }
    )
    run = RunDir.create(tmp_path, "calc")
    result = train(cfg, run)
    rows = [r for r in read_metrics(run.metrics_path) if "reward_mean" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(
        r.get("tool/ok", 0) + r.get("tool/unknown_tool", 0) + r.get("tool/malformed", 0) > 0 for r in rows
    )
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows) and rows[0]["turns_mean"] >= 1
    assert "greedy_acc" in result["eval_after"]
    reused = sum(r["kv_reused_tokens"] for r in rows)
    assert reused > 0 if tool_wait == "pin" else reused == 0


def test_guess_game_answers_each_guess_and_binary_search_wins():
    source = make_task("guess", high=63)
    for task in source.sample("train", 5, seed=4):
        env = make_env("guess", source, max_guesses=8)
        transcript = source.solution(task)

        async def play(moves, env=env, task=task):
            await env.reset(task, 0)
            return [await env.step(m) for m in moves]

        moves = [g.strip("+-") + ";" for g in transcript.split(";")[:-1]]
        results = asyncio.run(play(moves))
        assert [r.observation.text for r in results[:-1]] == [c for c in transcript if c in "+-"]
        assert results[-1].done and results[-1].reward == 1.0 and len(moves) <= 6  # ceil(log2(64))
        assert source.reward(task, transcript) == 1.0
        lost = asyncio.run(play(["x;"] + ["64;"] * 7))  # not a number, then always out of range
        assert lost[0].observation == Observation("?", "env") and lost[-1].done and lost[-1].reward == 0.0
    assert env.stop_strings == (";",)


class WrongType(OneCall):
    async def step(self, action: str):
        return "not a StepResult"


def test_an_environment_that_answers_wrongly_ends_its_episode(model, tokenizer):
    tasks = make_task("addition").sample("train", 2, seed=5)
    runner = EpisodeRunner(HFEngine(model, tokenizer), tokenizer, WrongType)
    try:
        samples = runner.run(_requests(tokenizer, tasks), {t.id: t for t in tasks})
    finally:
        runner.close()
    assert [s.reward for s in samples] == [0.0, 0.0] and runner.env_errors == 2
    with pytest.raises(RuntimeError, match="EpisodeRunner is closed"):
        runner.run(_requests(tokenizer, tasks), {t.id: t for t in tasks})


class Stalls(OneCall):
    async def step(self, action: str):
        await asyncio.sleep(30)  # a tool server that never answers
        return StepResult(None, 1.0, done=True)


def test_an_environment_past_its_timeout_ends_its_episode(model, tokenizer):
    tasks = make_task("addition").sample("train", 2, seed=6)
    runner = EpisodeRunner(HFEngine(model, tokenizer), tokenizer, Stalls, env_timeout_s=0.2)
    try:
        samples = runner.run(_requests(tokenizer, tasks), {t.id: t for t in tasks})
    finally:
        runner.close()
    assert [s.reward for s in samples] == [0.0, 0.0] and runner.env_errors == 2


class BlocksTheLoop(OneCall):
    async def step(self, action: str):
        time.sleep(self.observation_delay)  # a synchronous call inside async code: the loop cannot run
        return StepResult(None, 1.0, done=True)

    observation_delay = 6.0


@pytest.mark.train
@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited")  # the other episode's step never ran
def test_an_environment_that_blocks_the_event_loop_is_named_with_its_stack(model, tokenizer):
    """`asyncio.wait_for` cannot fire on a blocked loop: without the loop's heartbeat this run would wait
    for the blocking call however long it takes (forever, for a hung socket)."""
    from schedrl.rollout.episodes import EnvironmentsStuck

    tasks = make_task("addition").sample("train", 2, seed=6)
    runner = EpisodeRunner(HFEngine(model, tokenizer), tokenizer, BlocksTheLoop, env_timeout_s=1.0)
    start = time.perf_counter()
    try:
        with pytest.raises(EnvironmentsStuck) as info:
            runner.run(_requests(tokenizer, tasks), {t.id: t for t in tasks})
        waited = time.perf_counter() - start
    finally:
        runner.close()
    message = str(info.value)
    assert "the tool executor" in message and "thread 'environments'" in message
    assert "task.env_timeout_s=1" in message
    assert "in step" in message and "time.sleep(self.observation_delay)" in message  # where it blocks
    assert waited < BlocksTheLoop.observation_delay - 2  # it did not wait for the blocking call to end


def test_the_run_stops_when_environments_fail_above_the_configured_rate(model, tokenizer):
    from schedrl.rollout.episodes import EnvironmentFailure

    tasks = make_task("addition").sample("train", 6, seed=0)
    flaky = iter([OneCall(fail=i % 2 == 0) for i in range(6)])  # every other episode's tool server is gone
    engine = HFEngine(model, tokenizer, EngineConfig(max_concurrency=4))
    runner = EpisodeRunner(
        engine, tokenizer, lambda: next(flaky), max_turns=3, max_error_rate=0.3, min_episodes=4
    )
    try:
        with pytest.raises(
            EnvironmentFailure,
            match=r"failed \d+ times in [4-6] episodes \((40|50|60)\.0%\), above task.max_env_error_rate=0.3",
        ):
            runner.run(_requests(tokenizer, tasks), {t.id: t for t in tasks})
        assert "ConnectionError: the tool server went away" in (runner.last_env_error or "")
    finally:
        runner.close()
    calm = iter([OneCall(fail=i == 0) for i in range(6)])  # one failure in six: under the rate
    engine = HFEngine(
        model, tokenizer, EngineConfig(max_concurrency=4)
    )  # the stopped run left turns in the last
    runner = EpisodeRunner(
        engine, tokenizer, lambda: next(calm), max_turns=3, max_error_rate=0.3, min_episodes=4
    )
    try:
        samples = runner.run(_requests(tokenizer, tasks), {t.id: t for t in tasks})
        assert runner.env_errors == 1 and len(samples) == 6
    finally:
        runner.close()
