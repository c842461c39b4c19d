"""Losses beyond the PPO-clip family through the learner: Dr. GRPO's constant normaliser, PPO's value
head (optimizer, checkpoint state), SAO, ROVER, PACS (whole groups per micro-batch) and RAPID."""

from __future__ import annotations

import copy

import pytest
import torch

from schedrl.algos import drgrpo_loss
from schedrl.config import AlgoConfig, OptimConfig
from schedrl.training.batch import collate, prompt_groups
from schedrl.training.learner import Learner


def one_thread():
    """Tiny tensors: one thread is fastest, and several oversubscribe a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True, name="one_thread")
def _one_thread():
    yield from one_thread()


def grouped_batch(n_prompts=3, group=4, seed=0):
    """n_prompts prompts with `group` completions each, rows of a group not adjacent; rewards in {0, 1}."""
    g = torch.Generator().manual_seed(seed)
    prompts = [
        torch.randint(4, 90, (int(torch.randint(2, 5, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n_prompts)
    ]
    rows = [prompts[i % n_prompts] for i in range(n_prompts * group)]
    completions = [
        torch.randint(4, 90, (int(torch.randint(1, 5, (1,), generator=g)),), generator=g).tolist()
        for _ in rows
    ]
    rewards = torch.randint(0, 2, (len(rows),), generator=g).float()
    return collate(rows, completions, pad_id=0), rewards


def _vec(*modules):
    return torch.cat([torch.nn.utils.parameters_to_vector(m.parameters()).detach() for m in modules])


def _run(model, algo, optim, batch, signal, steps=1, **kw):
    learner = Learner(copy.deepcopy(model), optim, algo, total_steps=10, **kw)
    stats = [learner.update(batch, signal, s) for s in range(steps)]
    heads = [learner.value_head] if learner.value_head is not None else []
    return _vec(learner.model, *heads), learner, stats


def test_prompt_groups_labels_rows_by_prompt():
    batch, _ = grouped_batch(n_prompts=3, group=2)
    assert prompt_groups(batch).tolist() == [0, 1, 2, 0, 1, 2]


@pytest.mark.parametrize(
    "algo",
    [
        AlgoConfig(loss="drgrpo"),
        AlgoConfig(loss="ppo", advantage="reward"),
        AlgoConfig(loss="sao", advantage="reward"),
        AlgoConfig(loss="rover"),
        AlgoConfig(loss="pacs", advantage="reward"),
        AlgoConfig(loss="rapid"),
    ],
    ids=lambda a: a.loss,
)
def test_micro_batching_does_not_change_the_update(default_model, algo):
    batch, rewards = grouped_batch()
    big, _, stats = _run(default_model, algo, OptimConfig(micro_batch_size=64), batch, rewards)
    small, _, _ = _run(default_model, algo, OptimConfig(micro_batch_size=3), batch, rewards)
    assert torch.isfinite(torch.tensor(stats[0]["loss"]))
    before = torch.nn.utils.parameters_to_vector(default_model.parameters()).detach()
    assert not torch.allclose(big[: before.numel()], before)
    # Adam's first step is about lr * sign(g): float noise on near-zero gradients moves a few params ~1e-6
    torch.testing.assert_close(small, big, atol=1e-5, rtol=0)
    assert (small - big).abs().mean() < 1e-7


def test_drgrpo_divides_by_rows_times_budget(default_model):
    batch, rewards = grouped_batch()
    learner = Learner(
        copy.deepcopy(default_model), OptimConfig(), AlgoConfig(loss="drgrpo"), 10, max_new_tokens=6
    )
    logp = learner.logprobs(learner.model, batch)
    expected, _ = drgrpo_loss(logp, logp, rewards - 0.5, batch.mask, max_tokens=len(batch) * 6)
    stats = learner.update(batch, rewards - 0.5, 0)
    assert stats["loss"] == pytest.approx(expected.item(), rel=1e-5)


def test_ppo_value_head_is_trained_and_checkpointed(default_model):
    batch, rewards = grouped_batch()
    algo = AlgoConfig(loss="ppo", loss_args={"vf_coef": 0.5}, advantage="reward")
    _, learner, stats = _run(default_model, algo, OptimConfig(lr=1e-2, ppo_epochs=2), batch, rewards, steps=3)
    head = learner.value_head
    assert head is not None and any(
        p is q for g in learner.optimizer.param_groups for p in g["params"] for q in head.parameters()
    )
    assert head.linear.weight.abs().sum() > 0  # moved from its zero init
    assert stats[-1]["vf_loss"] < stats[0]["vf_loss"]
    state = learner.state_dict()
    fresh = Learner(copy.deepcopy(learner.model), OptimConfig(), algo, 10)
    fresh.load_state_dict(state)
    torch.testing.assert_close(_vec(fresh.value_head), _vec(head))
    assert (
        Learner(copy.deepcopy(default_model), OptimConfig(), AlgoConfig(), 10).state_dict()["value_head"]
        is None
    )


def test_pacs_micro_batches_hold_whole_groups(default_model):
    batch, rewards = grouped_batch(n_prompts=3, group=4)
    learner = Learner(
        copy.deepcopy(default_model), OptimConfig(micro_batch_size=5), AlgoConfig(loss="pacs"), 10
    )
    groups = prompt_groups(batch)
    chunks = learner._micro_batches(torch.arange(len(batch)), groups, batch)
    assert [len(c) for c in chunks] == [4, 4, 4]  # 4 + 4 > 5: one group per micro-batch
    for c in chunks:
        assert len(set(groups[c].tolist())) == 1
    minibatches = Learner(
        copy.deepcopy(default_model), OptimConfig(minibatches=3), AlgoConfig(loss="pacs"), 10
    )
    parts = minibatches._minibatch_indices(len(batch), True, torch.Generator().manual_seed(0), groups)
    assert sorted(len(set(groups[p].tolist())) for p in parts) == [1, 1, 1]
