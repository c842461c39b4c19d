"""A generative judge as a reward: its parsers in closed form; its templates checked; its verdicts equal
transformers' greedy `generate`; a tiny judge trained to say whether a completion equals the answer is
read as a reward with no parse failure; a judge whose verdicts do not parse stops the run past its bound,
naming the judge and a verdict; a run takes its reward from a judge."""

from __future__ import annotations

import random

import pytest
import torch

from schedrl.envs.scoring import RewardError
from schedrl.rewards.judge import Judge, JudgeError, parse_choice, parse_score, template_fields

TEMPLATE = "{completion}|{answer}?"


def test_parsers_in_closed_form():
    assert parse_score("Score: 7/10", 0, 10) == pytest.approx(0.7)
    assert parse_score("12", 0, 10) == 1.0 and parse_score("-3 points", 0, 10) == 0.0
    assert parse_score("2.5", 1, 4) == pytest.approx(0.5)
    assert parse_score("no number", 0, 10) is None
    choices = {"yes": 1.0, "no": 0.0, "yes, partly": 0.5}
    assert parse_choice(" Yes.", choices) == 1.0 and parse_choice("no", choices) == 0.0
    assert parse_choice("yes, partly", choices) == 0.5  # the longest choice it starts with
    assert parse_choice("maybe", choices) is None and parse_choice("", choices) is None


def test_templates_are_checked():
    assert template_fields("Q: {prompt} A: {completion} ({answer})") == ["prompt", "completion", "answer"]
    with pytest.raises(ValueError, match=r"unknown field\(s\) reply; known: prompt, completion, answer"):
        template_fields("{prompt} {reply}")
    with pytest.raises(ValueError, match=r"needs the field \{completion\}"):
        template_fields("{prompt} only")


def equal_rows(rng: random.Random, n: int) -> list[tuple[str, str]]:
    """(completion, answer) pairs, half of them equal."""
    rows = []
    for _ in range(n):
        a = "".join(rng.choice("0123456789") for _ in range(rng.randint(2, 3)))
        b = a if rng.random() < 0.5 else "".join(rng.choice("0123456789") for _ in range(len(a)))
        rows.append((b, a))
    return rows


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory):
    """A tiny causal LM trained to answer `yes` when the completion equals the answer, else `no`."""
    from schedrl.models import build_char_tokenizer, build_tiny_model
    from schedrl.training.batch import collate

    torch.manual_seed(0)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    rng = random.Random(0)
    for _ in range(400):
        rows = equal_rows(rng, 32)
        batch = collate(
            [tokenizer(TEMPLATE.format(completion=c, answer=a)).input_ids for c, a in rows],
            [tokenizer("yes" if c == a else "no").input_ids + [tokenizer.eos_token_id] for c, a in rows],
            tokenizer.pad_token_id,
        )
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch.targets, reduction="none")
        loss = (nll * batch.mask).sum() / batch.mask.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    path = tmp_path_factory.mktemp("judge")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.train
def test_verdicts_equal_transformers_greedy_generate(judge_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    judge = Judge(judge_dir, TEMPLATE, max_new_tokens=4)
    texts = [TEMPLATE.format(completion=c, answer=a) for c, a in equal_rows(random.Random(1), 12)]
    model, tokenizer = (
        AutoModelForCausalLM.from_pretrained(judge_dir),
        AutoTokenizer.from_pretrained(judge_dir),
    )
    want = []
    for t in texts:
        ids = tokenizer(t, return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        want.append(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
    assert judge.verdicts(texts) == want


def test_a_trained_judge_rewards_what_it_was_taught(judge_dir):
    judge = Judge(judge_dir, TEMPLATE, max_new_tokens=4)
    rows = equal_rows(random.Random(2), 200)
    rewards = judge([f"p{i}" for i in range(len(rows))], [c for c, _ in rows], answer=[a for _, a in rows])
    assert set(rewards) <= {0.0, 1.0} and judge.metrics() == {"judge/parse_failure_rate": 0.0}
    accuracy = sum((r == 1.0) == (c == a) for r, (c, a) in zip(rewards, rows, strict=True)) / len(rows)
    assert accuracy >= 0.85
    # the same verdicts read as a score: `yes` holds no number, so every one fails, scores 0, is counted
    scored = Judge(judge_dir, TEMPLATE, parser="score", max_new_tokens=4, min_samples=1000)
    assert scored(["p"] * 10, [c for c, _ in rows[:10]], answer=[a for _, a in rows[:10]]) == [0.0] * 10
    assert scored.metrics() == {"judge/parse_failure_rate": 1.0}


def test_a_judge_that_does_not_parse_stops_past_its_bound(judge_dir):
    judge = Judge(judge_dir, TEMPLATE, choices={"accept": 1.0}, max_parse_failure_rate=0.5, min_samples=8)
    rows = equal_rows(random.Random(3), 4)
    args = (["p"] * 4, [c for c, _ in rows])
    assert judge(*args, answer=[a for _, a in rows]) == [0.0] * 4  # under min_samples: counted, not fatal
    with pytest.raises(
        JudgeError, match=r"judge '.*': 8 of 8 verdicts did not parse .* the last was '(yes|no)'"
    ):
        judge(*args, answer=[a for _, a in rows])
    # through a run's scorer the bound still stops the run: it is not one more reward error scored 0
    from schedrl.envs.base import Task
    from schedrl.envs.scoring import RewardScorer
    from schedrl.envs.user import FileTask
    from schedrl.types import Sample, SamplingParams

    rows_ = [{"id": f"t{i}", "prompt": "p", "answer": a} for i, (_, a) in enumerate(rows)]
    source = FileTask(
        rows=rows_,
        reward=[
            {"judge": str(judge_dir), "template": TEMPLATE, "choices": {"accept": 1.0}, "min_samples": 4}
        ],
    )
    tasks = {
        r["id"]: Task(id=r["id"], prompt="p", answer=r["answer"], domain="file", metadata=dict(r))
        for r in rows_
    }
    samples = [
        Sample(f"s{i}", (1,), (2,), (0.0,), (0,), "stop", SamplingParams(), text=c, task_id=f"t{i}")
        for i, (c, _) in enumerate(rows)
    ]
    with pytest.raises(JudgeError, match="verdicts did not parse"):
        RewardScorer(source)(tasks, samples)
    with pytest.raises(ValueError, match=r"its template uses \{answer\}, but a task has no answer"):
        Judge(judge_dir, TEMPLATE)(*args)


def test_bad_judge_settings_are_named(judge_dir, tmp_path):
    with pytest.raises(ValueError, match=r"judge '.*': template: unknown field\(s\) x"):
        Judge(judge_dir, "{prompt}{completion}{x}")
    with pytest.raises(ValueError, match=r"parser must be one of score, choice, got 'regex'"):
        Judge(judge_dir, TEMPLATE, parser="regex")
    with pytest.raises(ValueError, match=r"score_range must be \[low, high\] with low < high"):
        Judge(judge_dir, TEMPLATE, parser="score", score_range=(5, 5))
    with pytest.raises(ValueError, match=r"judge '.*nothing': not a model directory"):
        Judge(tmp_path / "nothing", TEMPLATE)


@pytest.mark.train
def test_a_run_is_rewarded_by_a_judge(tmp_path, judge_dir):
    """`task.reward_model: {judge: DIR, ...}`: the reward is the judge's verdict alone, its parse failures
    logged; held-out evaluation still judges by the task's rule."""
    import schedrl
    from schedrl.training.run_dir import read_metrics

    spec = {"judge": str(judge_dir), "template": TEMPLATE, "max_new_tokens": 4, "rule_weight": 0.0}
    cfg = {
        "steps": 2, "save_every": 0, "out_dir": str(tmp_path), "name": "judged", "sft": {"steps": 20},
        "eval": {"tasks": 0}, "min_start_reward": -1.0, "logging": {"backends": ["jsonl"]},
        "task": {"name": "sort", "args": {"min_len": 2, "max_len": 3}, "reward_model": spec},
    }  # fmt: skip
    schedrl.train(cfg)
    rows = [r for r in read_metrics(tmp_path / "judged" / "metrics.jsonl") if "loss" in r]
    assert len(rows) == 2
    for r in rows:
        assert r["reward_mean"] == pytest.approx(r[f"rewards/judge_{judge_dir.name}/mean"], abs=1e-6)
        assert 0.0 <= r["judge/parse_failure_rate"] <= 1.0


def test_the_policy_judges_with_the_weights_of_its_latest_push(judge_dir):
    """`judge: policy` on a colocated engine worker: the judge runs on the worker's own model, so its
    verdicts follow each weight push. Pushed the trained judge's weights, the policy judges as that judge
    does; before, the policy (a sort model) says nothing that parses."""
    from transformers import AutoModelForCausalLM

    from schedrl.config import config_from_dict
    from schedrl.distributed import EngineWorker
    from schedrl.distributed.workers import cpu_weights
    from schedrl.envs import make_task
    from schedrl.orchestrate.build import load_policy
    from schedrl.rewards.mixed import ModelRewarded

    cfg = config_from_dict({"pipeline": {"reward_placement": "colocated"}})
    weights = cpu_weights(load_policy(cfg, None, torch.device("cpu"))[0])
    spec = {"judge": "policy", "template": TEMPLATE, "max_new_tokens": 4, "min_samples": 1000}
    source = ModelRewarded(make_task("sort"), {**spec, "rule_weight": 0.0})
    worker = EngineWorker(cfg, weights, 0, reward_source=source)
    judge = source.model
    assert isinstance(judge, Judge) and judge.engine.model is worker.engine.model  # the engine's own model
    rows = equal_rows(random.Random(4), 100)
    args = (["p"] * len(rows), [c for c, _ in rows])
    assert judge(*args, answer=[a for _, a in rows]) == [0.0] * len(rows)
    assert judge.metrics()["judge/parse_failure_rate"] > 0.9
    trained = cpu_weights(AutoModelForCausalLM.from_pretrained(judge_dir))
    worker.update_weights(trained, 1)
    rewards = judge(*args, answer=[a for _, a in rows])
    accuracy = sum((r == 1.0) == (c == a) for r, (c, a) in zip(rewards, rows, strict=True)) / len(rows)
    assert accuracy >= 0.85
    assert Judge(judge_dir, TEMPLATE, max_new_tokens=4)(*args, answer=[a for _, a in rows]) == rewards


def test_the_policy_judges_only_on_its_own_engine(tmp_path):
    import schedrl
    from schedrl.config import ConfigError

    cfg = {
        "out_dir": str(tmp_path), "sft": {"steps": 1},
        "task": {"name": "sort", "reward_model": {"judge": "policy", "template": TEMPLATE}},
        "pipeline": {"mode": "async", "reward_placement": "driver"},
    }  # fmt: skip
    with pytest.raises(
        ConfigError, match=r"judge 'policy'.* in pipeline.mode 'async', pipeline.reward_placement 'colocated'"
    ):
        schedrl.train(cfg)
    with pytest.raises(
        RewardError, match=r"judge 'policy' has no model: .* set pipeline.reward_placement: colocated"
    ):
        Judge("policy", TEMPLATE)(["p"], ["12"], answer=["12"])


@pytest.mark.train
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_run_is_rewarded_by_its_own_policy(tmp_path, mode):
    """Self-rewarding: `judge: policy` trains on the policy's verdicts, judged on the synchronous loop's
    engine or (async) on each engine worker's, colocated."""
    import schedrl
    from schedrl.training.run_dir import read_metrics

    spec = {
        "judge": "policy",
        "template": TEMPLATE,
        "parser": "score",
        "max_new_tokens": 2,
        "max_parse_failure_rate": 1.0,
        "rule_weight": 0.5,
    }
    cfg = {
        "steps": 2, "save_every": 0, "out_dir": str(tmp_path), "name": "self", "sft": {"steps": 20},
        "eval": {"tasks": 0}, "min_start_reward": -1.0, "logging": {"backends": ["jsonl"]},
        "task": {"name": "sort", "args": {"min_len": 2, "max_len": 3}, "reward_model": spec},
        "pipeline": {"mode": mode, "reward_placement": "colocated" if mode == "async" else "driver"},
    }  # fmt: skip
    schedrl.train(cfg)
    rows = [r for r in read_metrics(tmp_path / "self" / "metrics.jsonl") if "loss" in r]
    assert len(rows) == 2
    for r in rows:
        judged = r["rewards/judge_policy/mean"]
        assert r["reward_mean"] == pytest.approx(0.5 * r["rewards/rule/mean"] + judged, abs=1e-6)
        assert r["judge/parse_failure_rate"] > 0.0  # a sort policy rarely writes a number after '?'
