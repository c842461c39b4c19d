"""Padding-free learner forwards: the packed layout by hand, equality with the padded forward
(values and gradients), the learner's one-time check, and bad input."""

import copy
import logging

import pytest
import torch
from test_learner import make_batch

from schedrl.config import AlgoConfig, OptimConfig
from schedrl.train.batch import collate
from schedrl.train.learner import Learner
from schedrl.train.packing import pack


def test_layout_by_hand():
    # lengths 3, 1, 2 in rows of 4 tokens, first-fit decreasing: [s0 s0 s0 s1], [s2 s2 pad pad]
    ids = torch.tensor([[11, 12, 13], [21, 0, 0], [31, 32, 0]])
    mask = (ids != 0).long()
    p = pack(ids, mask, pad_id=9, width=4)
    assert p.input_ids.tolist() == [[11, 12, 13, 21], [31, 32, 9, 9]]
    assert p.position_ids.tolist() == [[0, 1, 2, 0], [0, 1, 0, 1]]
    assert p.unpack(p.input_ids[..., None].float())[..., 0].tolist() == ids.float().tolist()


def test_rows_widen_to_the_longest_sequence():
    ids = torch.ones(3, 10, dtype=torch.long)
    mask = torch.tensor([[1] * 10, [1] * 3 + [0] * 7, [1] * 2 + [0] * 8])
    p = pack(ids, mask, width=4)
    assert p.input_ids.shape == (2, 10) and p.position_ids[1].tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3, 4]


def test_left_padding_is_refused():
    with pytest.raises(ValueError, match=r"right-padded.*row 1 is \[0, 1, 1\]"):
        pack(torch.ones(2, 3, dtype=torch.long), torch.tensor([[1, 1, 1], [0, 1, 1]]))


def test_packed_forward_equals_padded_forward_values_and_gradients(default_model):
    model = copy.deepcopy(default_model).train()
    batch, _ = make_batch(n=24, seed=3)
    p = pack(batch.input_ids, batch.attention_mask, width=16)
    assert p.rows < len(batch)
    real = batch.attention_mask.bool()
    weights = torch.randn(batch.input_ids.shape + (model.config.vocab_size,)) * real[..., None]

    def loss_and_grads(logits):
        model.zero_grad()
        (logits * weights).sum().backward()
        return logits.detach(), [q.grad.clone() for q in model.parameters()]

    padded, g_padded = loss_and_grads(model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                            use_cache=False).logits)  # fmt: skip
    packed, g_packed = loss_and_grads(p.unpack(model(input_ids=p.input_ids, position_ids=p.position_ids,
                                                     use_cache=False).logits))  # fmt: skip
    torch.testing.assert_close(packed[real], padded[real], atol=1e-5, rtol=1e-5)
    assert (packed[~real] == 0).all()
    for a, b in zip(g_packed, g_padded, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)
    # the same rows without the position restart attend across sequences: the equality above is not free
    leaky = p.unpack(model(input_ids=p.input_ids, use_cache=False).logits).detach()
    assert (leaky[real] - padded[real]).abs().max() > 1e-2


@pytest.mark.parametrize("algo", [AlgoConfig(), AlgoConfig(name="ppo")])
def test_learner_update_is_the_same_with_and_without_packing(default_model, algo):
    batch, adv = make_batch(n=16, seed=1)
    adv = torch.rand(16) if algo.name == "ppo" else adv  # PPO reads the rewards
    out = {}
    for free in (True, False):
        model = copy.deepcopy(default_model)
        learner = Learner(model, OptimConfig(padding_free=free, micro_batch_tokens=0), algo, total_steps=2)
        stats = learner.update(batch, adv, 0)
        out[free] = torch.nn.utils.parameters_to_vector(model.parameters()).detach(), stats, learner
    assert out[True][2].padding_free and out[True][2]._packing_checked
    before = torch.nn.utils.parameters_to_vector(default_model.parameters()).detach()
    assert (out[False][0] - before).abs().max() > 1e-4  # one Adam step moves weights by ~lr = 3e-4
    torch.testing.assert_close(out[True][0], out[False][0], atol=2e-5, rtol=0)
    assert out[True][1]["loss"] == pytest.approx(out[False][1]["loss"], abs=1e-5)


class IgnoresPositions(torch.nn.Module):
    """A causal LM that numbers positions itself: packed sequences would see each other."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.config = inner, inner.config

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kw):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, **kw)


def test_learner_switches_packing_off_for_a_model_it_does_not_fit(default_model, caplog):
    model = IgnoresPositions(copy.deepcopy(default_model))
    learner = Learner(model, OptimConfig(micro_batch_tokens=0), AlgoConfig(), total_steps=1)
    batch = collate([[5, 6, 7]] * 3 + [[8, 9]] * 3, [[10]] * 6, pad_id=0)
    assert pack(batch.input_ids, batch.attention_mask).rows < len(batch)
    with caplog.at_level(logging.WARNING):
        learner.logprobs(model, batch)
    assert not learner.padding_free and "packing is off" in caplog.text
