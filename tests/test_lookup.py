"""`lookup`: a sub-agent per key reads a document the main agent never sees; the environment's branch and
return in closed form, and the warm-up's transcripts, one per context."""

from __future__ import annotations

import asyncio

import pytest

from schedrl.envs import make_env, make_task
from schedrl.envs.lookup import LookupEnv, LookupTask
from schedrl.training.sft import sft_batch


def _play(task, actions, lookup_reward=0.1):
    async def go():
        env = LookupEnv(LookupTask(), lookup_reward)
        await env.reset(task, 0)
        return [await env.step(a) for a in actions]

    return asyncio.run(go())


def test_each_ask_opens_a_sub_agent_on_its_document_and_its_answer_returns():
    src = LookupTask(keys=2, entries=4)
    (task,) = src.sample("train", 1, seed=3)
    keys = task.prompt.removeprefix("find ").removesuffix(":").split(",")
    values = task.metadata["values"]
    wrong = str((int(values[keys[1]]) + 1) % 10)
    out = _play(
        task, [f"ask {keys[0]};", f"{values[keys[0]]};", f"ask {keys[1]};", f"x{wrong}9;", f"{task.answer};"]
    )
    assert [r.context for r in out] == ["branch", "return", "branch", "return", "same"]
    doc = out[0].observation.text
    assert doc == task.metadata["docs"][keys[0]] and doc.endswith(f". {keys[0]}?")
    assert (
        f"{keys[0]}={values[keys[0]]}" in doc.split(". ")[0].split() and len(doc.split(". ")[0].split()) == 4
    )
    # the sub-agent's first digit goes back; a right one earns the lookup reward
    assert out[1].observation.text == f" got {values[keys[0]]}:" and out[1].reward == pytest.approx(0.1)
    assert out[3].observation.text == f" got {wrong}:" and out[3].reward == 0.0
    assert out[4].done and out[4].reward == 1.0
    # an unknown key is refused in the main context; a wrong final answer scores 0
    bad = _play(task, ["ask ?;", "00;"])
    assert bad[0].context == "same" and bad[0].observation.text == " no such key:" and bad[1].reward == 0.0


def test_the_warm_up_shows_every_context_s_transcript(tokenizer):
    src = LookupTask(keys=2)
    tasks = src.sample("train", 20, seed=0)
    for t in tasks:
        assert src.reward(t, src.solution(t)) == 1.0
        assert [c for _, c in src.contexts(t)] == [t.metadata["values"][k] + ";" for k in t.metadata["docs"]]
    batch = sft_batch(src, tokenizer, 4, seed=0)
    assert batch.input_ids.shape[0] == 4 * (1 + 2)  # each task's main transcript and its two sub-agents'
    assert {t.id for t in src.sample("eval", 20, seed=0)}.isdisjoint(
        t.id for t in src.sample("train", 300, seed=0)
    )
    # the split is by documents: held-out episodes ask for most letters, not the few whose prompt hashes there
    assert len({t.prompt for t in LookupTask(keys=1).sample("eval", 200, seed=0)}) > 20


def test_a_log_document_is_the_key_s_settings_and_the_last_one_holds():
    src = LookupTask(keys=2, entries=3, document="log")
    for task in src.sample("train", 30, seed=1):
        for key, doc in task.metadata["docs"].items():
            settings = doc.removesuffix(f". {key}?").split()
            assert len(settings) == 3 and all(s.startswith(f"{key}=") for s in settings)
            assert task.metadata["values"][key] == settings[-1][-1]
        assert src.reward(task, src.solution(task)) == 1.0
    # the last setting decides: the earlier ones differ from it in some documents
    docs = [d for t in src.sample("train", 30, seed=1) for d in t.metadata["docs"].values()]
    assert any(len({s[-1] for s in d.split(". ")[0].split()}) > 1 for d in docs)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="keys"):
        make_task("lookup", keys=0)
    with pytest.raises(ValueError, match="entries"):
        make_task("lookup", entries=1)
    with pytest.raises(ValueError, match="document must be one of table, log, got 'book'"):
        make_task("lookup", document="book")
    with pytest.raises(ValueError, match="lookup_reward"):
        make_env("lookup", LookupTask(), lookup_reward=1.0)
