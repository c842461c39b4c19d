"""Reward-model rewards: a local sequence-classification model scores completions in batches, equal to
scoring each text alone; truncation keeps the completion; running normalisation in closed form; mixed
with rule rewards by weight in a file task; bad models and settings refused naming the directory."""

from __future__ import annotations

import statistics

import pytest
import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

from schedrl.envs.base import Task
from schedrl.envs.user import FileTask
from schedrl.models import build_char_tokenizer
from schedrl.rewards import RewardModel


def save_reward_model(path, num_labels: int = 1, pad: bool = True, seed: int = 0):
    """A tiny Llama reward model (random weights) and the char tokenizer, saved to `path`."""
    tokenizer = build_char_tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256, num_labels=num_labels,
        pad_token_id=tokenizer.pad_token_id if pad else None,
    )  # fmt: skip
    model = LlamaForSequenceClassification(config)
    with torch.no_grad():
        model.score.weight.normal_(0, 1.0)  # scores of a useful spread
    model.save_pretrained(path)
    if not pad:
        tokenizer.pad_token = None
    tokenizer.save_pretrained(path)
    return model, tokenizer


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("rm")
    save_reward_model(path)
    return path


def alone(model, tokenizer, text: str, max_length: int = 512) -> float:
    """The reference: one text, no padding, the last token's logit."""
    ids = tokenizer(text, truncation=True, max_length=max_length)["input_ids"]
    with torch.no_grad():
        return float(model(input_ids=torch.tensor([ids])).logits[0, 0])


def test_batched_scores_equal_each_text_scored_alone(rm_dir):
    rm = RewardModel(rm_dir, batch_size=3)
    reference = LlamaForSequenceClassification.from_pretrained(rm_dir).eval()
    prompts = ["2+3=", "sort: cab ->", "hello", "x", "a longer prompt of some length: "]
    completions = ["5", " abc", " world!", "yz" * 10, "ok"]
    got = rm(prompts, completions)
    want = [alone(reference, rm.tokenizer, p + c) for p, c in zip(prompts, completions, strict=True)]
    assert got == pytest.approx(want, abs=1e-5)
    assert max(want) - min(want) > 0.05  # the texts score differently: padding mistakes would show


def test_left_truncation_keeps_the_completion(rm_dir):
    rm = RewardModel(rm_dir, max_length=12, truncation="left")
    reference = LlamaForSequenceClassification.from_pretrained(rm_dir).eval()
    prompt, completion = "a very long prompt that will be cut ", "the end"
    ids = rm.tokenizer(prompt + completion)["input_ids"]
    [score] = rm([prompt], [completion])
    with torch.no_grad():
        want = float(reference(input_ids=torch.tensor([ids[-12:]])).logits[0, 0])
    assert score == pytest.approx(want, abs=1e-5)
    right = RewardModel(rm_dir, max_length=12, truncation="right")
    with torch.no_grad():
        want_right = float(reference(input_ids=torch.tensor([ids[:12]])).logits[0, 0])
    assert right([prompt], [completion])[0] == pytest.approx(want_right, abs=1e-5)


def test_running_normalisation_in_closed_form(rm_dir):
    raw = RewardModel(rm_dir)
    rm = RewardModel(rm_dir, normalize="running")
    first, second = (["a", "bb", "ccc"], ["1", "22", "333"]), (["dd", "e"], ["44", "5"])
    r1, r2 = raw(*first), raw(*second)
    n1, n2 = rm(*first), rm(*second)
    seen = r1 + r2
    mean, std = statistics.fmean(seen), statistics.pstdev(seen)
    assert n2 == pytest.approx([(x - mean) / std for x in r2], abs=1e-6)
    m1, s1 = statistics.fmean(r1), statistics.pstdev(r1)
    assert n1 == pytest.approx([(x - m1) / s1 for x in r1], abs=1e-6)


def test_group_normalisation_in_closed_form(rm_dir):
    raw = RewardModel(rm_dir)
    rm = RewardModel(rm_dir, normalize="group")
    prompts, completions = ["a", "b", "a", "a", "c", "b"], ["1", "22", "333", "4", "5", "66"]
    r, n = raw(prompts, completions), rm(prompts, completions)
    for p in set(prompts):
        idx = [i for i, q in enumerate(prompts) if q == p]
        group = [r[i] for i in idx]
        for i in idx:
            want = 0.0 if len(idx) == 1 else (r[i] - statistics.fmean(group)) / statistics.pstdev(group)
            assert n[i] == pytest.approx(want, abs=1e-6)
    assert n[4] == 0.0 and n[0] != 0.0


def test_a_reward_model_mixes_with_a_rule_by_weight(rm_dir):
    def exact(task, completion):
        return float(completion == task.answer)

    rows = [{"id": f"t{i}", "prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(4)]
    task = FileTask(
        rows=rows, reward=[exact, {"reward_model": str(rm_dir), "batch_size": 2}], reward_weights=[1.0, 0.5]
    )
    tasks = [Task(id=r["id"], prompt=r["prompt"], answer=r["answer"], domain="file") for r in rows]
    completions = ["1", "2", "9", "4"]
    rewards, metrics, errors = task.rewards.score(tasks, completions, [[] for _ in completions])
    rm_scores = RewardModel(rm_dir)([t.prompt for t in tasks], completions)
    rule = [1.0, 1.0, 0.0, 1.0]  # answers 1, 2, 3, 4
    assert rewards == pytest.approx([r + 0.5 * s for r, s in zip(rule, rm_scores, strict=True)], abs=1e-5)
    assert metrics[f"rewards/reward_model_{rm_dir.name}/mean"] == pytest.approx(
        statistics.fmean(rm_scores), abs=1e-6
    )
    assert errors == [None] * 4


def test_bad_reward_models_are_named(tmp_path):
    two = tmp_path / "two"
    save_reward_model(two, num_labels=2)
    with pytest.raises(ValueError, match=r"reward model '.*two': its head gives 2 scores per sequence"):
        RewardModel(two)
    nopad = tmp_path / "nopad"
    save_reward_model(nopad, pad=False)
    with pytest.raises(ValueError, match=r"reward model '.*nopad': its tokenizer has no pad token"):
        RewardModel(nopad)
    with pytest.raises(ValueError, match=r"reward model '.*missing': not a model directory"):
        RewardModel(tmp_path / "missing")
    with pytest.raises(ValueError, match=r"truncation must be one of left, right, got 'middle'"):
        RewardModel(two, truncation="middle")
    rows = [{"id": "a", "prompt": "p", "answer": "x"}]
    with pytest.raises(ValueError, match=r"unknown key\(s\) batch; known: reward_model, batch_size"):
        FileTask(rows=rows, reward=[{"reward_model": str(two), "batch": 4}])


@pytest.mark.train
def test_a_run_rewarded_by_rule_and_reward_model(tmp_path, rm_dir):
    """`task.reward_model` on a built-in task: every step's reward is the rule's plus half the model's
    score, both logged."""
    import schedrl
    from schedrl.training.run_dir import read_metrics

    cfg = {
        "steps": 2, "save_every": 0, "out_dir": str(tmp_path), "name": "rm", "sft": {"steps": 5},
        "eval": {"tasks": 0}, "min_start_reward": 0.0, "logging": {"backends": ["jsonl"]},
        "task": {"name": "addition", "reward_model": {"path": str(rm_dir), "weight": 0.5}},
    }  # fmt: skip
    schedrl.train(cfg)
    rows = [r for r in read_metrics(tmp_path / "rm" / "metrics.jsonl") if "loss" in r]
    assert len(rows) == 2
    for r in rows:
        rule, model = r["rewards/rule/mean"], r[f"rewards/reward_model_{rm_dir.name}/mean"]
        assert r["reward_mean"] == pytest.approx(rule + 0.5 * model, abs=1e-5)
        assert model != 0.0


def test_a_bad_reward_model_setting_names_the_field(tmp_path, rm_dir):
    import schedrl
    from schedrl.config import ConfigError

    task = {"name": "addition", "reward_model": {"path": str(rm_dir), "weigth": 0.5}}
    with pytest.raises(
        ConfigError,
        match=r"'task.reward_model': unknown key\(s\) weigth; known: path, batch_size.*, weight, rule_weight",
    ):
        schedrl.train({"out_dir": str(tmp_path), "task": task, "sft": {"steps": 1}})


@pytest.mark.train
def test_the_kl_reference_is_the_policy_rl_starts_from(tmp_path):
    """With `algo.kl_coef`, the reference is the model after the SFT warm-up: the first update's KL is ~0,
    and the saved reference equals checkpoint 0's policy."""
    from safetensors.torch import load_file

    import schedrl
    from schedrl.training.run_dir import read_metrics

    cfg = {
        "steps": 1, "save_every": 0, "out_dir": str(tmp_path), "name": "kl", "sft": {"steps": 20},
        "eval": {"tasks": 0}, "min_start_reward": 0.0, "logging": {"backends": ["jsonl"]},
        "algo": {"kl_coef": 0.1}, "task": {"name": "sort", "args": {"min_len": 2, "max_len": 3}},
    }  # fmt: skip
    schedrl.train(cfg)
    run = tmp_path / "kl"
    [row] = [r for r in read_metrics(run / "metrics.jsonl") if "loss" in r]
    assert abs(row["kl"]) < 1e-6  # one update, on-policy: the policy is still its reference
    ref = load_file(run / "ref_model" / "model.safetensors")
    start = load_file(run / "checkpoints" / "step_000000" / "model" / "model.safetensors")
    assert all(torch.equal(ref[k], start[k]) for k in start)
