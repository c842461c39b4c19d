"""verifiers 0.4 tasksets (the v1 API) through the `verifiers` task (.venv-verifiers-v1): the tasks are
the taskset's, with its system prompt and answers; a completion's reward equals the reward verifiers'
own rollout gives the same reply (a scripted client behind its harness), and the closed-form weighted
sum of the task's rewards; a run trains on it; multi-turn and an unknown taskset are refused by name."""

from __future__ import annotations

import asyncio
import time

import pytest

vf = pytest.importorskip("verifiers.v1", reason="v1 tasksets need the extra schedrl[verifiers-v1]")

from schedrl.envs import make_env, make_task  # noqa: E402
from schedrl.envs.verifiers_examples.sort_v1 import SYSTEM  # noqa: E402
from schedrl.envs.verifiers_v1 import V1Tasks  # noqa: E402

SORT = "schedrl.envs.verifiers_examples.sort_v1"


def source(n: int = 60) -> V1Tasks:
    src = make_task("verifiers", env_id=SORT, env_args={"n": n})
    assert isinstance(src, V1Tasks)
    return src


def test_tasks_are_the_taskset_s_with_its_prompts_and_answers():
    src = source()
    sort = make_task("sort", min_len=2, max_len=3)
    expected = {t.prompt: t.answer for t in sort.sample("train", 60, 0)}
    train, held = src.tasks("train"), src.tasks("eval")
    assert len(train) + len(held) == 60 and held  # every task once; about a tenth held out
    for t in train + held:
        system, user = t.messages or ()
        assert system == {"role": "system", "content": SYSTEM} and user["role"] == "user"
        assert t.answer == expected[user["content"]] == "".join(sorted(user["content"][5:-1]))
    assert {t.prompt for t in train}.isdisjoint(t.prompt for t in held)  # a repeated prompt: one split


def test_rewards_are_the_weighted_sum_of_the_task_s_rewards_and_log_each():
    src = source()
    task = src.sample("train", 1, seed=0)[0]
    right, wrong = f"<answer>{task.answer}</answer>", "<answer>0</answer>"
    # correct (weight 1) and formatted (weight 0.2)
    assert src.reward(task, right) == pytest.approx(1.2)
    assert src.reward(task, f"so {right}") == pytest.approx(1.0)
    assert src.reward(task, wrong) == pytest.approx(0.2)
    assert src.reward(task, task.answer) == 0.0
    rewards, metrics, errors = src.reward_batch([task, task], [right, wrong], [[], []])
    assert rewards == pytest.approx([1.2, 0.2]) and errors == [None, None]
    assert metrics["rewards/correct/mean"] == 0.5 and metrics["rewards/formatted/mean"] == 1.0
    assert metrics["rewards/reply_chars/mean"] == pytest.approx((len(right) + len(wrong)) / 2)


def test_a_reward_equals_verifiers_own_rollout_of_the_same_reply(monkeypatch):
    """verifiers runs the task through its null harness (a chat program it launches with uv) and its
    interception server; the model behind it is a scripted client that replies with a fixed text."""
    import shutil

    if shutil.which("uv") is None:
        pytest.skip("verifiers launches its harness with uv")
    import verifiers.v1.interception.server as server
    from verifiers.v1.clients.train import serialize_completion
    from verifiers.v1.runtimes import SubprocessConfig

    src = source()
    task = src.sample("train", 1, seed=1)[0]
    replies = {"right": f"<answer>{task.answer}</answer>", "loose": f"it is <answer>{task.answer}</answer>"}

    def scripted(text: str):
        class Scripted(vf.Client):
            async def get_response(self, dialect, body, sampling, session_id=None, turn=None, headers=None):
                resp = vf.Response(
                    id="scripted", created=int(time.time()), model=body["model"],
                    message=vf.AssistantMessage(content=text), finish_reason="stop",
                    usage=vf.Usage(prompt_tokens=1, completion_tokens=1),
                )  # fmt: skip
                resp.raw = serialize_completion(resp, body["model"])
                return resp

        return Scripted()

    async def rollout(text: str) -> float:
        monkeypatch.setattr(server, "resolve_client", lambda config: scripted(text))  # the harness's model
        client = vf.TrainClientConfig(base_url="http://127.0.0.1:9/unused", api_key_var="UNUSED_KEY")
        agent = vf.make_agent(
            vf.AgentConfig(model="scripted", client=client, harness=vf.harness_config_type("null")(id="null"),
                           runtime=SubprocessConfig())
        )  # fmt: skip
        async with agent:
            trace = await agent.run(src._tasks[task.id])
        assert trace.ok, [e.message for e in trace.errors]
        return float(trace.reward)

    for text in replies.values():
        assert src.reward(task, text) == pytest.approx(asyncio.run(rollout(text)))


def test_a_run_trains_on_a_v1_taskset(tmp_path):
    import schedrl
    from schedrl.training.run_dir import read_metrics

    cfg = {
        "steps": 2, "save_every": 0, "out_dir": str(tmp_path), "name": "vf1", "sft": {"steps": 20},
        "eval": {"tasks": 4, "k": 1}, "min_start_reward": -1.0, "logging": {"backends": ["jsonl"]},
        "task": {"name": "verifiers", "args": {"env_id": SORT, "env_args": {"n": 200}}},
        "sampling": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 24},
    }  # fmt: skip
    schedrl.train(cfg)
    rows = [r for r in read_metrics(tmp_path / "vf1" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2] and all("rewards/correct/mean" in r for r in rows)


def test_multi_turn_and_an_unknown_taskset_are_refused_by_name():
    with pytest.raises(ValueError, match=r"verifiers 0\.4.* has the v1 API only; its multi-turn episodes"):
        make_env("verifiers", source())
    with pytest.raises(ValueError, match=r"task 'verifiers': taskset 'no_such_taskset'"):
        make_task("verifiers", env_id="no_such_taskset").sample("train", 1, 0)
    with pytest.raises(ValueError, match=r"taskset 'schedrl.envs.digits'.*exactly one vf.Taskset subclass"):
        make_task("verifiers", env_id="schedrl.envs.digits").sample("train", 1, 0)
