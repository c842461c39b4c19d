"""Padding-free learner forwards: the packed layout by hand, equality with the padded forward
(values and gradients), shared prompts (GRPO prefix reuse) likewise, the learner's one-time
check and its fall-backs, and bad input."""

import copy
import logging
from types import SimpleNamespace

import pytest
import torch
from test_learner import make_batch

from schedrl.config import AlgoConfig, OptimConfig
from schedrl.training.batch import collate, prompt_lengths
from schedrl.training.learner import Learner, takes_4d_masks
from schedrl.training.packing import pack, pack_fewest, pack_shared


def group_batch(n_prompts=4, g=6, seed=0):
    """`n_prompts` random prompts of 2-6 tokens, each with `g` random completions of 1-5 tokens."""
    gen = torch.Generator().manual_seed(seed)
    rand = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=gen))  # noqa: E731
    prompts, completions = [], []
    for _ in range(n_prompts):
        prompt = [rand(4, 90) for _ in range(rand(2, 7))]
        for _ in range(g):
            prompts.append(prompt)
            completions.append([rand(4, 90) for _ in range(rand(1, 6))])
    return collate(prompts, completions, pad_id=0)


def forward_and_grads(model, weights, **inputs_and_unpack):
    """Logits (B, L, V) of one forward and the parameter gradients of sum(logits * weights)."""
    unpack = inputs_and_unpack.pop("unpack", lambda x: x)
    model.zero_grad()
    logits = unpack(model(use_cache=False, **inputs_and_unpack).logits)
    (logits * weights).sum().backward()
    return logits.detach(), [q.grad.clone() for q in model.parameters()]


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

    padded, g_padded = forward_and_grads(
        model, weights, input_ids=batch.input_ids, attention_mask=batch.attention_mask
    )
    packed, g_packed = forward_and_grads(model, weights, unpack=p.unpack, **p.model_inputs(torch.float32))
    torch.testing.assert_close(packed[real], padded[real], atol=1e-5, rtol=1e-5)
    assert (packed[~real] == 0).all()
    for a, b in zip(g_packed, g_padded, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)
    # the same rows without the position restart attend across sequences: the equality above is not free
    leaky = p.unpack(model(input_ids=p.input_ids, use_cache=False).logits).detach()
    assert (leaky[real] - padded[real]).abs().max() > 1e-2


def update_with_and_without(default_model, algo, batch, adv, flag):
    """One learner update from `default_model` with OptimConfig `flag` on and off: {on: (params, stats, learner)}."""
    out = {}
    for on in (True, False):
        model = copy.deepcopy(default_model)
        learner = Learner(model, OptimConfig(**{flag: on}, micro_batch_tokens=0), algo, total_steps=2)
        stats = learner.update(batch, adv, 0)
        out[on] = torch.nn.utils.parameters_to_vector(model.parameters()).detach(), stats, learner
    torch.testing.assert_close(out[True][0], out[False][0], atol=2e-5, rtol=0)
    assert out[True][1]["loss"] == pytest.approx(out[False][1]["loss"], abs=1e-5)
    return out


@pytest.mark.parametrize("algo", [AlgoConfig(), AlgoConfig(loss="ppo")])
def test_learner_update_is_the_same_with_and_without_packing(default_model, algo):
    batch, adv = make_batch(n=16, seed=1)
    adv = torch.rand(16) if algo.loss == "ppo" else adv  # PPO reads the rewards
    out = update_with_and_without(default_model, algo, batch, adv, "padding_free")
    assert out[True][2].padding_free and out[True][2]._packing_checked
    before = torch.nn.utils.parameters_to_vector(default_model.parameters()).detach()
    assert (out[False][0] - before).abs().max() > 1e-4  # one Adam step moves weights by ~lr = 3e-4


class Wrapped(torch.nn.Module):
    """A causal LM around `inner`, whose forward changes what reaches it."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.config = inner, inner.config


class IgnoresPositions(Wrapped):
    """A causal LM that numbers positions itself: packed sequences would see each other."""

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kw):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, **kw)


def test_learner_switches_packing_off_for_a_model_it_does_not_fit(default_model, caplog):
    model = IgnoresPositions(copy.deepcopy(default_model))
    learner = Learner(model, OptimConfig(micro_batch_tokens=0), AlgoConfig(), total_steps=1)
    batch = collate([[5, 6, 7]] * 3 + [[8, 9]] * 3, [[10, 11]] * 6, pad_id=0)
    assert pack(batch.input_ids, batch.attention_mask).saves_tokens
    with caplog.at_level(logging.WARNING):
        learner.logprobs(model, batch)
    # the shared layout numbers completions from the prompt's end: wrong here, so sharing goes off first
    assert "prompt sharing is off" in caplog.text and not learner.forward_prompt_once
    assert not learner.padding_free and "packing is off" in caplog.text


def test_shared_layout_by_hand():
    # prompt [5 6] with completions [7] and [8 9]; prompt [3] with completion [4]: one row of 7
    ids = torch.tensor([[5, 6, 7, 0], [5, 6, 8, 9], [3, 4, 0, 0]])
    mask = (ids != 0).long()
    p = pack_shared(ids, mask, torch.tensor([2, 2, 1]), pad_id=0, width=5)
    assert p.input_ids.tolist() == [[5, 6, 7, 8, 9, 3, 4]]
    assert p.position_ids.tolist() == [[0, 1, 2, 2, 3, 0, 1]]
    assert p.attention_mask[0, 0].int().tolist() == [
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0],  # [7] sees its prompt and itself
        [1, 1, 0, 1, 0, 0, 0],  # [8 9] sees its prompt, not [7]
        [1, 1, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 0, 1, 0],  # the other prompt sees only itself
        [0, 0, 0, 0, 0, 1, 1],
    ]
    assert p.unpack(p.input_ids[..., None].float())[..., 0].tolist() == (ids * mask).float().tolist()
    assert p.saves_tokens and p.input_ids.numel() == 7 < ids.numel()


def test_a_group_longer_than_a_row_repeats_its_prompt():
    # units hold at most 2 x 4 tokens: [5 | 7 7 7 | 8 8 8], then [5 | 9 9 9]
    ids = torch.tensor([[5, 7, 7, 7], [5, 8, 8, 8], [5, 9, 9, 9]])
    p = pack_shared(ids, torch.ones_like(ids), torch.tensor([1, 1, 1]), width=4)
    assert p.input_ids.tolist() == [[5, 7, 7, 7, 8, 8, 8, 0], [5, 9, 9, 9, 0, 0, 0, 0]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 1, 2, 3, 0], [0, 1, 2, 3, 0, 0, 0, 0]]
    assert (
        p.attention_mask[1, 0, 4:, 4:] == torch.eye(4, dtype=torch.bool)
    ).all()  # padding sees itself only
    assert p.unpack(p.input_ids[..., None].float())[..., 0].tolist() == ids.float().tolist()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("width", [64, 12])  # all groups in one row each / groups split over rows
def test_shared_forward_equals_padded_forward_values_and_gradients(default_model, width, attn):
    model = copy.deepcopy(default_model).train()
    model.set_attn_implementation(attn)
    batch = group_batch(seed=width)
    p = pack_shared(batch.input_ids, batch.attention_mask, prompt_lengths(batch), width=width)
    assert p.input_ids.numel() < pack(batch.input_ids, batch.attention_mask, width=width).input_ids.numel()
    real = batch.attention_mask.bool()
    weights = torch.randn(batch.input_ids.shape + (model.config.vocab_size,)) * real[..., None]
    padded, g_padded = forward_and_grads(
        model, weights, input_ids=batch.input_ids, attention_mask=batch.attention_mask
    )
    shared, g_shared = forward_and_grads(model, weights, unpack=p.unpack, **p.model_inputs(torch.float32))
    torch.testing.assert_close(shared[real], padded[real], atol=1e-5, rtol=1e-5)
    for a, b in zip(g_shared, g_padded, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)
    # without the mask, completions of one prompt see each other: the equality above is not free
    leaky = p.unpack(
        model(input_ids=p.input_ids, position_ids=p.position_ids, use_cache=False).logits
    ).detach()
    assert (leaky[real] - padded[real]).abs().max() > 1e-2


@pytest.mark.parametrize(
    "algo", [AlgoConfig(), AlgoConfig(loss="ppo")]
)  # PPO: the value head reads hidden states
def test_learner_update_is_the_same_with_and_without_shared_prompts(default_model, algo):
    batch, adv = group_batch(seed=5), torch.rand(24, generator=torch.Generator().manual_seed(5))
    out = update_with_and_without(default_model, algo, batch, adv, "forward_prompt_once")
    for share, (_, _, learner) in out.items():
        layout = learner._packing(batch)
        assert (
            learner.forward_prompt_once == share
            and (layout is not None and layout.unit_ids is not None) == share
        )


class Drops4DMasks(Wrapped):
    """A causal LM whose kernel takes no custom mask (as flash attention): shared prompts would leak."""

    def forward(self, input_ids, attention_mask=None, **kw):
        keep = attention_mask is not None and attention_mask.dim() == 2
        return self.inner(input_ids=input_ids, attention_mask=attention_mask if keep else None, **kw)


def test_learner_falls_back_to_plain_packing_for_a_model_without_4d_masks(default_model, caplog):
    model = Drops4DMasks(copy.deepcopy(default_model))
    learner = Learner(model, OptimConfig(micro_batch_tokens=0), AlgoConfig(), total_steps=1)
    batch = group_batch(seed=2)
    with caplog.at_level(logging.WARNING):
        got = learner.logprobs(model, batch)
    assert "prompt sharing is off" in caplog.text and not learner.forward_prompt_once
    assert learner.padding_free and "packing is off" not in caplog.text
    with torch.no_grad():
        want = Learner(default_model, OptimConfig(padding_free=False), AlgoConfig(), total_steps=1).logprobs(
            default_model, batch
        )
    torch.testing.assert_close(got * batch.mask, want * batch.mask, atol=1e-5, rtol=0)


def test_a_fallback_that_packs_nothing_leaves_the_check_to_the_next_batch(default_model, caplog):
    model = IgnoresPositions(copy.deepcopy(default_model))
    learner = Learner(model, OptimConfig(micro_batch_tokens=0), AlgoConfig(), total_steps=1)
    same_length = collate([[5, 6, 7]] * 4, [[10, 11]] * 4, pad_id=0)  # plain packing saves nothing here
    assert not pack(same_length.input_ids, same_length.attention_mask).saves_tokens
    with caplog.at_level(logging.WARNING):
        learner.logprobs(model, same_length)
        assert "prompt sharing is off" in caplog.text and learner.padding_free
        mixed = collate([[5, 6, 7]] * 3 + [[8, 9]] * 3, [[10, 11]] * 6, pad_id=0)
        got = learner.logprobs(model, mixed)  # plain packing would leak here: it is checked first
    assert not learner.padding_free and "packing is off" in caplog.text
    want = Learner(default_model, OptimConfig(padding_free=False), AlgoConfig(), total_steps=1).logprobs(
        default_model, mixed
    )
    torch.testing.assert_close(got * mixed.mask, want * mixed.mask, atol=1e-5, rtol=0)


def stub(**config):
    model = torch.nn.Linear(1, 1)
    model.config = SimpleNamespace(**config)
    return model


def test_prompts_are_shared_only_under_kernels_that_take_4d_masks():
    assert takes_4d_masks(stub(_attn_implementation="sdpa")) and takes_4d_masks(
        stub(_attn_implementation="eager")
    )
    assert not takes_4d_masks(stub(_attn_implementation="flash_attention_2"))  # reads a 2D padding mask only
    assert not takes_4d_masks(
        stub(_attn_implementation="sdpa", layer_types=["full_attention", "sliding_attention"])
    )
    assert not takes_4d_masks(stub(_attn_implementation="sdpa", sliding_window=4096))
    assert takes_4d_masks(stub(_attn_implementation="sdpa", sliding_window=4096, use_sliding_window=False))
    model = stub(_attn_implementation="flash_attention_2")
    assert not Learner(model, OptimConfig(), AlgoConfig(), total_steps=1).forward_prompt_once


def test_micro_batches_keep_a_group_together_and_count_its_prompt_once(default_model):
    # two groups: prompt of 4 tokens, 4 completions of 2 -> 12 tokens shared (24 unshared); one of 6
    batch = collate([[5, 6, 7, 8]] * 4 + [[9, 10, 11]] * 2, [[12, 13]] * 4 + [[14]] * 2, pad_id=0)
    shared = Learner(default_model, OptimConfig(micro_batch_tokens=12), AlgoConfig(), total_steps=1)
    assert [c.tolist() for c in shared._chunks(torch.arange(6), batch)] == [[0, 1, 2, 3], [4, 5]]
    plain = Learner(
        default_model,
        OptimConfig(micro_batch_tokens=12, forward_prompt_once=False),
        AlgoConfig(),
        total_steps=1,
    )
    assert [c.tolist() for c in plain._chunks(torch.arange(6), batch)] == [[0, 1], [2, 3], [4, 5]]


def test_pack_fewest_shares_only_when_it_saves_tokens():
    grouped = group_batch(seed=4)
    chosen = pack_fewest(grouped.input_ids, grouped.attention_mask, prompt_lengths(grouped))
    assert chosen.unit_ids is not None
    assert (
        chosen.input_ids.numel()
        == pack_shared(grouped.input_ids, grouped.attention_mask, prompt_lengths(grouped)).input_ids.numel()
    )
    # distinct prompts of 40, 30, 24 tokens: rows of 64 take [40 24] [30] (128); shared rows of 2 x 40
    # take [40 30] [24] (160), so the plain layout is kept
    lengths = [40, 30, 24]
    ids = torch.zeros(3, 40, dtype=torch.long)
    for r, n in enumerate(lengths):
        ids[r, :n] = torch.arange(100 * (r + 1), 100 * (r + 1) + n)
    mask = (ids != 0).long()
    assert pack_shared(ids, mask, torch.tensor([5, 5, 5])).input_ids.numel() == 160
    chosen = pack_fewest(ids, mask, torch.tensor([5, 5, 5]))
    assert chosen.unit_ids is None and chosen.input_ids.shape == (2, 64)
