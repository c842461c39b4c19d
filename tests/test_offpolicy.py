"""Off-policy corrections (decoupled PPO, truncated IS, cross-stage IS): closed-form values worked out
by hand, and gradients that reach pi_theta only."""

from __future__ import annotations

import math

import pytest
import torch

from schedrl.algos import (
    cross_stage_is_loss,
    cross_stage_weight,
    decoupled_ppo_loss,
    get,
    grpo_loss,
    is_weight,
    offpolicy_stats,
    tis_loss,
)

LN = math.log


def _batch():
    # r = pi_theta / pi_prox: row 0 = (1.5, 0.5, pad), row 1 = (1.5, 0.5, 1.0); A = (+1, -1)
    # rho = pi_prox / pi_behav:  row 0 = (2, 0.5, pad),  row 1 = (1, 3, 0.25)
    prox = torch.tensor([[-1.0, -1.0, -1e4], [-2.0, -2.0, -2.0]], dtype=torch.float64)
    logp = prox + torch.tensor([[LN(1.5), LN(0.5), 2e4], [LN(1.5), LN(0.5), 0.0]], dtype=torch.float64)
    behav = prox - torch.tensor([[LN(2), LN(0.5), -3e4], [0.0, LN(3), LN(0.25)]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    return logp, prox, behav, torch.tensor([1.0, -1.0], dtype=torch.float64), mask


def _leaves(*xs):
    return [x.clone().requires_grad_(True) for x in xs]


def test_registered_under_their_names():
    assert get("loss", "decoupled_ppo") is decoupled_ppo_loss
    assert get("loss", "tis") is tis_loss
    assert get("loss", "cross_stage_is") is cross_stage_is_loss


def test_is_weight_caps_without_overflow_and_is_detached():
    num = torch.tensor([[0.0, 1e4, LN(3)]], requires_grad=True)
    behav = torch.zeros(1, 3)
    w = is_weight(num, behav, torch.tensor([[1, 1, 0]]), is_cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.0, 2.0, 1.0]]))  # exp(0) = 1, exp(1e4) -> C, padding 1
    assert not w.requires_grad
    assert is_weight(num, behav, torch.ones(1, 3), None)[0, 2].item() == pytest.approx(3.0)  # no cap
    for bad in (0.5, float("nan")):
        with pytest.raises(ValueError, match="is_cap must be >= 1"):
            is_weight(num, behav, torch.ones(1, 3), bad)


def test_decoupled_ppo_closed_form():
    logp, prox, behav, adv, mask = _batch()
    # eps = 0.2; PPO token losses -min(r A, clip(r) A): row 0: -1.2, -0.5; row 1: 1.5, 0.8, 1.0
    # cap C = 1.5: w = (1.5, 0.5 | 1, 1.5, 0.25)
    # L = (-1.2*1.5 - 0.5*0.5 + 1.5*1 + 0.8*1.5 + 1.0*0.25) / 5 = 0.9 / 5 = 0.18
    loss, stats = decoupled_ppo_loss(logp, prox, adv, mask, behav_logp=behav, is_cap=1.5)
    assert loss.item() == pytest.approx(0.18)
    assert stats["is_weight_mean"] == pytest.approx(4.75 / 5)
    assert stats["clipfrac"] == pytest.approx(0.4)  # the two clipped tokens, as in plain PPO
    # no cap (AReaL's default): w = (2, 0.5 | 1, 3, 0.25): (-2.4 - 0.25 + 1.5 + 2.4 + 0.25) / 5 = 0.3
    assert decoupled_ppo_loss(logp, prox, adv, mask, behav_logp=behav)[0].item() == pytest.approx(0.3)


def test_decoupled_ppo_with_behaviour_equal_to_proximal_is_grpo():
    logp, prox, _, adv, mask = _batch()
    ref = prox - 0.1
    kw = {"clip_eps": 0.1, "clip_eps_high": 0.3, "ref_logp": ref, "kl_coef": 0.05, "agg": "seq_mean"}
    a, _ = decoupled_ppo_loss(logp, prox, adv, mask, behav_logp=prox, is_cap=1.5, **kw)
    b, _ = grpo_loss(logp, prox, adv, mask, **kw)
    torch.testing.assert_close(a, b)


def test_decoupled_ppo_gradient_reaches_only_logp():
    logp, prox, behav, adv, mask = _batch()
    logp, prox, behav = _leaves(logp, prox, behav)
    loss, _ = decoupled_ppo_loss(logp, prox, adv, mask, behav_logp=behav, is_cap=1.5)
    loss.backward()
    assert prox.grad is None and behav.grad is None
    # dL/dlogp_t = -w_t A_t r_t / 5 where r A is the smaller term, else 0 (clipped):
    # row 0: r=1.5, A=+1 clipped -> 0; r=0.5, A=+1 -> -0.5*0.5/5 = -0.05
    # row 1: r=1.5, A=-1 -> +1*1.5/5 = 0.3; r=0.5, A=-1 clipped -> 0; r=1, A=-1 -> 0.25/5 = 0.05
    expected = torch.tensor([[0.0, -0.05, 0.0], [0.3, 0.0, 0.05]], dtype=torch.float64)
    torch.testing.assert_close(logp.grad, expected)


def test_tis_closed_form_and_gradient():
    # rho = pi_theta / pi_behav = (3, 0.5 | 1, 2.5), cap 2 -> w = (2, 0.5 | 1, 2); A = (+1, -1)
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -3.0, 0.0]], dtype=torch.float64)
    behav = logp - torch.tensor([[LN(3), LN(0.5), 0.0], [0.0, LN(2.5), 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    logp_leaf, behav_leaf = _leaves(logp, behav)
    loss, stats = tis_loss(logp_leaf, logp.detach(), adv, mask, behav_logp=behav_leaf, is_cap=2.0)
    # L = -(2*1*(-1) + 0.5*1*(-2) + 1*(-1)*(-0.5) + 2*(-1)*(-3)) / 4 = -3.5 / 4
    assert loss.item() == pytest.approx(-0.875)
    assert stats["is_weight_mean"] == pytest.approx(5.5 / 4)
    assert stats["is_weight_capped_frac"] == pytest.approx(0.5)
    loss.backward()
    # the weight is a constant: dL/dlogp = -w A / 4 (a live weight would add -w A logp / 4 on uncapped tokens)
    expected = torch.tensor([[-0.5, -0.125, 0.0], [0.25, 0.5, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(logp_leaf.grad, expected)
    assert behav_leaf.grad is None


def test_tis_on_policy_is_reinforce():
    logp, _, _, adv, mask = _batch()
    a, _ = tis_loss(logp, logp, adv, mask, behav_logp=logp, is_cap=2.0)
    m = mask.bool()
    b = -(adv[:, None] * logp).masked_fill(~m, 0.0).sum() / m.sum()
    torch.testing.assert_close(a, b)


def test_cross_stage_closed_form():
    logp, prox, behav, adv, mask = _batch()
    # proximal version 3; row 0 tokens from versions (1, 3), row 1 from (2, 2, 3); padding may hold anything
    versions = torch.tensor([[1, 3, 99], [2, 2, 3]])
    w, stale = cross_stage_weight(prox, behav, versions, 3, mask, is_cap=1.5)
    # stale tokens get min(rho, 1.5): rho = 2 -> 1.5, 1 -> 1, 3 -> 1.5; fresh tokens (version 3) get 1
    torch.testing.assert_close(w, torch.tensor([[1.5, 1.0, 1.0], [1.0, 1.5, 1.0]], dtype=torch.float64))
    assert stale.tolist() == [[True, False, False], [True, True, False]]
    loss, stats = cross_stage_is_loss(
        logp, prox, adv, mask, behav_logp=behav, versions=versions, prox_version=3, is_cap=1.5
    )
    # (-1.2*1.5 - 0.5*1 + 1.5*1 + 0.8*1.5 + 1.0*1) / 5 = 1.4 / 5
    assert loss.item() == pytest.approx(0.28)
    assert stats["stale_token_frac"] == pytest.approx(0.6)


def test_cross_stage_limits_and_version_check():
    logp, prox, behav, adv, mask = _batch()
    kw = {"behav_logp": behav, "is_cap": 1.5}
    all_stale = torch.zeros(2, 3, dtype=torch.long)
    torch.testing.assert_close(
        cross_stage_is_loss(logp, prox, adv, mask, versions=all_stale, prox_version=1, **kw)[0],
        decoupled_ppo_loss(logp, prox, adv, mask, **kw)[0],
    )
    torch.testing.assert_close(
        cross_stage_is_loss(logp, prox, adv, mask, versions=all_stale, prox_version=0, **kw)[0],
        grpo_loss(logp, prox, adv, mask)[0],
    )
    with pytest.raises(ValueError, match="version 4 > the proximal policy's 3"):
        cross_stage_is_loss(logp, prox, adv, mask, versions=all_stale + 4, prox_version=3, **kw)


def test_cross_stage_gradient_reaches_only_logp():
    logp, prox, behav, adv, mask = _batch()
    logp, prox, behav = _leaves(logp, prox, behav)
    versions = torch.tensor([[1, 3, 0], [2, 2, 3]])
    cross_stage_is_loss(logp, prox, adv, mask, behav_logp=behav, versions=versions, prox_version=3)[
        0
    ].backward()
    assert prox.grad is None and behav.grad is None and logp.grad.abs().sum() > 0


def test_offpolicy_stats_closed_form():
    _, prox, behav, _, mask = _batch()
    stats = offpolicy_stats(prox, behav, mask, is_cap=1.5)
    rho = [2.0, 0.5, 1.0, 3.0, 0.25]
    assert stats["is_ratio_mean"] == pytest.approx(sum(rho) / 5)
    assert stats["is_ratio_max"] == pytest.approx(3.0)
    assert stats["is_capped_frac"] == pytest.approx(0.4)  # 2 and 3 exceed 1.5
    # k3 of KL(pi_behav || pi_prox) per token: rho - 1 - ln rho
    assert stats["behaviour_kl"] == pytest.approx(sum(r - 1 - LN(r) for r in rho) / 5)
    same = offpolicy_stats(prox, prox, mask)
    assert same["behaviour_kl"] == 0.0 and same["is_ratio_mean"] == 1.0 and same["is_capped_frac"] == 0.0
