"""A short learning run per algorithm on a toy task: the reward rises.

The toy task: after a two-character prompt, emit digits; the reward is the fraction of the two
completion tokens that are digits (about 0.1 for the untrained tiny model, whose vocabulary has ~100
tokens). Sampling is a plain loop over the policy (no engine), so each run takes a second or two on
one thread. The off-policy corrections sample from a copy of the policy one or two versions behind,
with per-token versions.
"""

from __future__ import annotations

import copy
import string

import pytest
import torch
from test_learner_algos import one_thread

from schedrl.algos import registry
from schedrl.config import AlgoConfig, OptimConfig
from schedrl.training.batch import collate
from schedrl.training.learner import Learner

LETTERS = string.ascii_lowercase[:16]
STEPS, LENGTH = 12, 2


@pytest.fixture(autouse=True)
def _one_thread():
    yield from one_thread()


def sample(samplers, prompts, group, gen):
    """`group` completions per prompt, token k drawn by `samplers[k]` = (model, version).

    Returns prompts, completions, behaviour log-probs and the policy version of every token.
    """
    rows = [p for p in prompts for _ in range(group)]
    ids = torch.tensor(rows)
    logps = []
    with torch.no_grad():
        for model, _ in samplers:
            logp_all = torch.log_softmax(model(input_ids=ids).logits[:, -1].float(), dim=-1)
            tok = torch.multinomial(logp_all.exp(), 1, generator=gen)
            logps.append(logp_all.gather(-1, tok))
            ids = torch.cat([ids, tok], dim=1)
    versions = [[v for _, v in samplers] for _ in rows]
    return rows, ids[:, len(rows[0]) :].tolist(), torch.cat(logps, dim=1).tolist(), versions


def learn(model, tokenizer, algo, optim, n_prompts=8, group=4, lag=0, resumed=False):
    """Train for STEPS steps; returns the mean reward of each step.

    The sampler is a copy of the policy refreshed every lag + 1 steps (lag = 0: on-policy). With
    `resumed`, only the first token comes from that copy and the second from the current weights, as in
    a sample cut before a weight update and resumed after it.
    """
    digits = set(tokenizer.convert_tokens_to_ids(list(string.digits)))
    prompts = [tokenizer.convert_tokens_to_ids([c, "="]) for c in LETTERS[:n_prompts]]
    learner = Learner(copy.deepcopy(model), optim, algo, total_steps=STEPS)
    sampler, sampler_version = copy.deepcopy(learner.model), 0
    gen = torch.Generator().manual_seed(0)
    advantage = registry.get("advantage", algo.advantage)
    curve = []
    for step in range(STEPS):
        if step - sampler_version > lag:
            sampler, sampler_version = copy.deepcopy(learner.model), step
        stages = [(sampler, sampler_version)] * LENGTH
        if resumed:
            stages[1:] = [(learner.model, step)] * (LENGTH - 1)
        rows, completions, logps, versions = sample(stages, prompts, group, gen)
        rewards = torch.tensor([sum(t in digits for t in c) / LENGTH for c in completions])
        groups = torch.arange(len(prompts)).repeat_interleave(group)
        adv = advantage(rewards, groups, std_normalize=algo.std_normalize)
        batch = collate(rows, completions, tokenizer.pad_token_id, logps, versions)
        stats = learner.update(batch, adv, step)
        if lag and step - sampler_version > 0:
            assert stats["behaviour_kl"] > 0  # the sampler is really behind
        curve.append(float(rewards.mean()))
    return curve


def assert_rises(curve):
    first, last = sum(curve[:3]) / 3, sum(curve[-3:]) / 3
    assert last > first + 0.2, (first, last, curve)


OPTIM = OptimConfig(lr=1e-2)
CASES = {
    "grpo": (AlgoConfig(), {}),
    "ppo": (AlgoConfig(loss="ppo", loss_args={"vf_coef": 0.5}, advantage="reward"), {}),
    "decoupled": (AlgoConfig(correction="decoupled"), {"lag": 1}),
}
SLOW_CASES = {
    "drgrpo": (AlgoConfig(loss="drgrpo", std_normalize=False), {}),
    "dapo": (AlgoConfig(loss="dapo", loss_args={"clip_eps_high": 0.28}), {}),
    "gspo": (
        AlgoConfig(loss="gspo", loss_args={"clip_eps": 3e-4, "clip_eps_high": 4e-4}, loss_agg="seq_mean"),
        {},
    ),
    "cispo": (AlgoConfig(loss="cispo", loss_args={"clip_eps": 1.0, "clip_eps_high": 4.0}), {}),
    "lite_ppo": (AlgoConfig(advantage="lite_ppo"), {}),
    "rloo": (AlgoConfig(advantage="rloo", std_normalize=False), {}),
    "reinforce_pp": (AlgoConfig(advantage="reinforce_pp"), {"n_prompts": 32, "group": 1}),
    "reinforce_pp_baseline": (AlgoConfig(advantage="reinforce_pp_baseline"), {}),
    "sao": (
        AlgoConfig(loss="sao", loss_args={"vf_coef": 0.5}, advantage="reward"),
        {"n_prompts": 16, "group": 1},
    ),
    "rover": (AlgoConfig(loss="rover", std_normalize=False), {}),
    "pacs": (AlgoConfig(loss="pacs", advantage="reward"), {}),
    "rapid": (AlgoConfig(loss="rapid"), {"n_prompts": 16, "optim": OptimConfig(lr=1e-2, minibatches=4)}),
    "tis": (AlgoConfig(correction="tis"), {"lag": 1}),
    "cross_stage": (AlgoConfig(correction="cross_stage"), {"lag": 2, "resumed": True}),
}


def _run(default_model, tokenizer, case):
    algo, kw = case
    kw = dict(kw)
    return learn(default_model, tokenizer, algo, kw.pop("optim", OPTIM), **kw)


@pytest.mark.parametrize("name", sorted(CASES))
def test_reward_rises(default_model, tokenizer, name):
    assert_rises(_run(default_model, tokenizer, CASES[name]))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SLOW_CASES))
def test_reward_rises_slow(default_model, tokenizer, name):
    assert_rises(_run(default_model, tokenizer, SLOW_CASES[name]))
