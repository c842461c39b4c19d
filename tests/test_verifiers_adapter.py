"""verifiers environments through the `verifiers` adapter (verifiers' classic API; .venv-verifiers):
single-turn rewards equal verifiers' own rollout and rubric on the same completion; a multi-turn episode
equals verifiers' own rollout driven by a scripted client; a ToolEnv's tool runs from a hermes call;
runs train on both; an unknown environment is named."""

from __future__ import annotations

import asyncio
import json

import pytest

vf = pytest.importorskip("verifiers", reason="the verifiers adapter needs the extra schedrl[verifiers]")
if not hasattr(vf, "Rubric"):
    pytest.skip("verifiers without the classic API", allow_module_level=True)

from schedrl.envs import make_env, make_task  # noqa: E402

SORT = "schedrl.envs.verifiers_examples.sort_xml"
GUESS = "schedrl.envs.verifiers_examples.guess"
CALC = "schedrl.envs.verifiers_examples.calc_tools"


def scripted(texts: list[str]):
    """A verifiers client that answers each model call with the next of `texts`."""
    from verifiers.types import Response, ResponseMessage

    answers = iter(texts)

    class Scripted(vf.Client):
        def setup_client(self, config):
            return None

        async def to_native_tool(self, tool):
            return tool

        async def to_native_prompt(self, messages):
            return messages, {}

        async def get_native_response(self, prompt, model, sampling_args, tools=None, **kw):
            message = ResponseMessage(content=next(answers), finish_reason="stop", is_truncated=False)
            return Response(id="x", created=0, model=model, message=message)

        async def raise_from_native_response(self, response):
            return None

        async def from_native_response(self, response):
            return response

        async def close(self):
            return None

    return Scripted(None)


def by_verifiers(source, task, texts: list[str]) -> tuple[float, list[str]]:
    """verifiers' own rollout and rubric, the model's turns scripted."""

    async def go():
        state = await source.env.rollout(source.input_of(task), scripted(texts), "m", {})
        await source.env.rubric.score_rollout(state)
        return float(state["reward"]), [str(m.content) for m in state["completion"]]

    return asyncio.run(go())


def test_single_turn_rewards_equal_verifiers_own_rollout():
    source = make_task("verifiers", env_id=SORT, env_args={"n": 40})
    tasks = source.sample("train", 6, seed=0)
    texts = [
        source.solution(t) if i % 2 else f"<answer>{t.answer[::-1]}9</answer>" for i, t in enumerate(tasks)
    ]
    texts[0] = "no tags at all"
    rewards, metrics, errors = source.reward_batch(tasks, texts, [[]] * len(tasks))
    assert rewards == [by_verifiers(source, t, [x])[0] for t, x in zip(tasks, texts, strict=True)]
    assert rewards[1] == pytest.approx(1.2) and errors == [None] * 6  # right answer, right format
    assert metrics["rewards/correct/mean"] == pytest.approx(0.5)
    assert source.sample("eval", 3, 0)[0].id not in {t.id for t in source.tasks("train")}


def test_a_multi_turn_episode_equals_verifiers_own_rollout():
    source = make_task("verifiers", env_id=GUESS, env_args={"n": 10})
    env = make_env("verifiers", source)
    for task in source.sample("train", 3, seed=1):
        turns = ["31", "x", "15", task.answer]

        async def play(task=task, turns=turns):
            seen = [(await env.reset(task, 0)).text]
            for t in turns:
                r = await env.step(t)
                seen.append(r)
                if r.done:
                    break
            await env.close()
            return seen

        seen = asyncio.run(play())
        reward, completion = by_verifiers(source, task, turns)
        assert seen[0] == "user: guess 0-63\nassistant: " and seen[-1].reward == reward == 1.0
        replies = [c for i, c in enumerate(completion) if i % 2 == 1]  # the environment's messages
        assert [r.observation.text for r in seen[1:-1]] == [f"user: {c}\nassistant: " for c in replies[:-1]]


def test_a_tool_env_runs_its_tool_from_a_hermes_call():
    source = make_task("verifiers", env_id=CALC, env_args={"n": 10})
    env = make_env("verifiers", source)
    (task,) = source.sample("train", 1, seed=0)
    a, b = task.prompt.removeprefix("user: ").rstrip("=").split("+")

    async def play():
        await env.reset(task, 0)
        call = {"name": "add", "arguments": {"a": int(a), "b": int(b)}}
        called = await env.step(f"<tool_call>{json.dumps(call)}</tool_call>")
        answered = await env.step(f"{int(a) + int(b)}")
        await env.close()
        return called, answered

    called, answered = asyncio.run(play())
    assert called.observation.text == f"tool: {int(a) + int(b)}\nassistant: " and not called.done
    assert answered.done and answered.reward == 1.0 and answered.info["stop_condition"] == "no_tools_called"


@pytest.mark.parametrize("multi_turn", [False, True], ids=["single_turn", "multi_turn"])
def test_runs_train_on_verifiers_environments(tmp_path, multi_turn):
    import schedrl
    from schedrl.training.run_dir import read_metrics

    task = (
        {
            "name": "verifiers",
            "args": {"env_id": GUESS, "env_args": {"n": 50}},
            "env": "verifiers",
            "max_turns": 6,
        }
        if multi_turn
        else {"name": "verifiers", "args": {"env_id": SORT, "env_args": {"n": 200}}}
    )
    cfg = {
        "steps": 2, "save_every": 0, "out_dir": str(tmp_path), "name": "vf", "sft": {"steps": 0 if multi_turn else 20},
        "eval": {"tasks": 4, "k": 1}, "min_start_reward": -1.0, "logging": {"backends": ["jsonl"]},
        "task": task, "sampling": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 24},
    }  # fmt: skip
    schedrl.train(cfg)
    rows = [r for r in read_metrics(tmp_path / "vf" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    if not multi_turn:
        assert all("rewards/correct/mean" in r for r in rows)


def test_an_unknown_environment_is_named():
    with pytest.raises(ValueError, match=r"task 'verifiers': environment 'no-such-env'"):
        make_task("verifiers", env_id="no-such-env").sample("train", 1, 0)
    with pytest.raises(ValueError, match=r"env 'verifiers' runs the 'verifiers' task's environment"):
        make_env("verifiers", make_task("sort"))
