"""RAPID, SAO, ROVER, PACS and the PPO value-head pieces: closed-form values worked out by hand,
stop-gradients, and the on-policy limits each docstring claims."""

from __future__ import annotations

import math

import pytest
import torch

from schedrl.algos import (
    first_token_values,
    get,
    grpo_loss,
    pacs_loss,
    ppo_advantages,
    ppo_clip_loss,
    ppo_loss,
    rapid_loss,
    raw_reward,
    rover_loss,
    sao_loss,
    terminal_rewards,
    value_loss,
    vocab_mean_logp,
    whiten,
)

LN = math.log
F64 = torch.float64


def _leaf(x):
    return x.clone().to(F64).requires_grad_(True)


def test_registered_names():
    for name, fn in {
        "rapid": rapid_loss,
        "sao": sao_loss,
        "rover": rover_loss,
        "pacs": pacs_loss,
        "ppo": ppo_loss,
    }.items():
        assert get("loss", name) is fn
    assert get("advantage", "reward") is raw_reward
    r = torch.tensor([1, 0, 1])
    assert raw_reward(r, torch.zeros(3, dtype=torch.long), std_normalize=True).tolist() == [1.0, 0.0, 1.0]


# ---------------------------------------------------------------- RAPID


def test_rapid_closed_form_and_gradient():
    # row 0: two tokens, pi_theta/pi_old = 1.5 * 2 = 3 -> capped at C = 2; row 1: one token, ratio 0.5
    logp = _leaf(torch.tensor([[-1.0, -2.0], [-0.5, 0.0]]))
    old = logp.detach() - torch.tensor([[LN(1.5), LN(2.0)], [LN(0.5), 0.0]], dtype=F64)
    old = old.requires_grad_(True)
    mask = torch.tensor([[1, 1], [1, 0]])
    adv = torch.tensor([1.0, -2.0], dtype=F64)
    loss, stats = rapid_loss(logp, old, adv, mask, is_cap=2.0)
    # seq_mean: row 0: -2*1*(-1 - 2)/2 = 3; row 1: -0.5*(-2)*(-0.5) = -0.5 -> (3 - 0.5)/2 = 1.25
    assert loss.item() == pytest.approx(1.25)
    assert stats["is_weight_mean"] == pytest.approx(1.25) and stats["is_weight_capped_frac"] == 0.5
    loss.backward()
    # dL/dlogp = -w A / (2 rows * n_i): row 0: -2/4 = -0.5; row 1: -0.5*(-2)/2 = 0.5; the weight is a constant
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.5, -0.5], [0.5, 0.0]], dtype=F64))
    assert old.grad is None


def test_rapid_on_policy_is_group_reinforce():
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]])
    mask, adv = torch.ones(2, 2), torch.tensor([1.0, -1.0])
    loss, _ = rapid_loss(logp, logp, adv, mask, agg="token_mean")
    torch.testing.assert_close(loss, -(adv[:, None] * logp).mean())


# ---------------------------------------------------------------- SAO


def _sao_batch():
    mask = torch.tensor([[0, 1, 1], [1, 1, 0]])  # row 0's first completion target is at index 1
    old = torch.tensor([[0.0, -1.0, -1.0], [-2.0, -2.0, 0.0]], dtype=F64)
    logp = old + torch.tensor([[0.0, LN(1.5), LN(0.7)], [LN(1.1), LN(1.3), 0.0]], dtype=F64)
    values = torch.tensor([[9.0, 0.5, 7.0], [0.2, 5.0, 5.0]], dtype=F64)
    return logp, old, torch.tensor([1.0, 0.0], dtype=F64), mask, values


def test_first_token_values_reads_the_prompt_state():
    _, _, _, mask, values = _sao_batch()
    assert first_token_values(values, mask).tolist() == [0.5, 0.2]
    assert first_token_values(values, torch.zeros(2, 3)).tolist() == [0.0, 0.0]


def test_sao_closed_form_and_strict_clipping():
    logp, old, r, mask, values = _sao_batch()
    logp, values = _leaf(logp), _leaf(values)
    loss, stats = sao_loss(logp, old, r, mask, values=values, vf_coef=0.1)
    # b = V(prompt) = (0.5, 0.2); A = r - b = (0.5, -0.2)
    # ratios (1.5, 0.7 | 1.1, 1.3) clip to (1.2, 0.8 | 1.1, 1.2)
    # policy: (-1.2*0.5 - 0.8*0.5 + 1.1*0.2 + 1.2*0.2) / 4 = -0.54 / 4 = -0.135
    # value: 0.5 * ((0.5 - 1)^2 + (0.2 - 0)^2) / 2 = 0.0725;  L = -0.135 + 0.1 * 0.0725
    assert loss.item() == pytest.approx(-0.135 + 0.00725)
    assert stats["clipfrac"] == pytest.approx(0.75) and stats["vf_loss"] == pytest.approx(0.0725)
    loss.backward()
    # only the token inside the band (ratio 1.1) has a policy gradient: -1.1 * (-0.2) / 4 = 0.055
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.0, 0.0], [0.055, 0.0, 0.0]], dtype=F64))
    # V gets only the value loss's gradient (the baseline in A is detached): 0.1 * (b - r) / 2
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, -0.025, 0.0], [0.01, 0.0, 0.0]], dtype=F64))


def test_sao_clips_where_ppo_would_not():
    logp, old, r, mask, values = _sao_batch()
    a = r - first_token_values(values, mask)
    ppo_logp = _leaf(logp)
    ppo_clip_loss(ppo_logp, old, a, mask)[0].backward()
    # PPO's min() keeps the gradient of ratio 0.7 with A > 0 and of ratio 1.3 with A < 0; SAO drops both
    assert ppo_logp.grad[0, 2] != 0 and ppo_logp.grad[1, 1] != 0


# ---------------------------------------------------------------- ROVER


def test_vocab_mean_logp():
    logits = torch.tensor([[[0.0, LN(3.0)]]])  # p = (1/4, 3/4)
    expected = (LN(0.25) + LN(0.75)) / 2
    assert vocab_mean_logp(logits).item() == pytest.approx(expected, rel=1e-6)


def test_rover_closed_form_and_gradient():
    old = torch.tensor([[-1.0, -1.0, -1.0]], dtype=F64)
    logp = _leaf(old + torch.tensor([[LN(2.0), LN(0.5), 3.0]], dtype=F64))
    old_mean = torch.zeros(1, 3, dtype=F64)
    mean = _leaf(
        torch.tensor([[0.3, 0.1, 0.7]], dtype=F64)
    )  # mean_v Q(s_t, v) = (0.3, 0.1, 0.7) with rho = 1
    mask = torch.tensor([[1, 1, 0]])
    adv = torch.tensor([0.5], dtype=F64)
    loss, stats = rover_loss(logp, old, adv, mask, mean_logp=mean, old_mean_logp=old_mean)
    # Q = (ln 2, -ln 2); targets: t0 = 0.5 + meanQ(s_1) = 0.6; t1 is last: 0.5
    q, t = torch.tensor([LN(2.0), -LN(2.0)]), torch.tensor([0.6, 0.5])
    assert loss.item() == pytest.approx(float(((q - t) ** 2).mean()))
    assert stats["q_target_mean"] == pytest.approx(0.55)
    loss.backward()
    torch.testing.assert_close(logp.grad[0, :2], (q - t).to(F64))  # d/dQ of the mean square, rho = 1
    assert logp.grad[0, 2] == 0 and mean.grad is None  # padding and the bootstrap target get no gradient
    old_leaf = _leaf(old)
    rover_loss(logp, old_leaf, adv, mask, mean_logp=mean, old_mean_logp=old_mean)[0].backward()
    assert old_leaf.grad is None
    # rho = 2: Q and the bootstrap both scale: Q = (2 ln 2, -2 ln 2), targets (0.5 + 0.2, 0.5)
    loss2, _ = rover_loss(logp, old, adv, mask, mean_logp=mean, old_mean_logp=old_mean, rover_temp=2.0)
    q2, t2 = 2 * q, torch.tensor([0.7, 0.5])
    assert loss2.item() == pytest.approx(float(((q2 - t2) ** 2).mean()))


def test_rover_on_policy_gradient_is_centred_reinforce():
    logp = _leaf(torch.tensor([[-1.0, -2.0], [-0.5, -0.3]]))
    mean = torch.full((2, 2), -3.0, dtype=F64)
    adv = torch.tensor([0.5, -0.5], dtype=F64)
    rover_loss(
        logp, logp.detach(), adv, torch.ones(2, 2), mean_logp=mean, old_mean_logp=mean, rover_temp=1.5
    )[0].backward()
    # Q = 0, target = r~: grad = 2 * (0 - r~) * rho / 4 = -0.75 r~
    torch.testing.assert_close(logp.grad, (-0.75 * adv)[:, None].expand(2, 2))


# ---------------------------------------------------------------- PACS


def _pacs_batch():
    # psi = sum_t (logp - old) = (1, 0, -1 | 0.5); groups {0, 1, 2} and {3}; labels (1, 0, 0 | 1)
    old = torch.full((4, 2), -1.0, dtype=F64)
    logp = old + torch.tensor([[0.5, 0.5], [0.0, 0.0], [-1.0, 0.0], [0.5, 0.0]], dtype=F64)
    return (
        logp,
        old,
        torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=F64),
        torch.ones(4, 2),
        torch.tensor([7, 7, 7, 2]),
    )


def test_pacs_closed_form():
    logp, old, labels, mask, groups = _pacs_batch()
    loss, stats = pacs_loss(logp, old, labels, mask, group_index=groups)
    # leave-one-out scores: s = (1 - (-0.5), 0 - 0, -1 - 0.5 | 0.5) = (1.5, 0, -1.5 | 0.5)
    # BCE: softplus(-1.5), ln 2, softplus(-1.5), softplus(-0.5)
    sp = lambda x: math.log1p(math.exp(x))  # noqa: E731
    assert loss.item() == pytest.approx((2 * sp(-1.5) + LN(2.0) + sp(-0.5)) / 4)
    assert stats["label_acc"] == 1.0 and stats["score_mean"] == pytest.approx(0.125)


def test_pacs_on_policy_gradient_is_rloo():
    logp, _, labels, mask, groups = _pacs_batch()
    logp, old = _leaf(logp), _leaf(logp)
    pacs_loss(logp, old, labels, mask, group_index=groups)[0].backward()
    assert old.grad is None  # pi_old is the log-ratio's fixed reference
    # dL/dpsi_j = -(R_j - mean_{i != j} R_i) / B in a group; a group of one: (sigmoid(0) - R) / B
    per_seq = torch.tensor([-0.25, 0.125, 0.125, -0.125], dtype=F64)
    torch.testing.assert_close(logp.grad, per_seq[:, None].expand(4, 2))


def test_pacs_validates_labels():
    logp, old, _, mask, groups = _pacs_batch()
    with pytest.raises(ValueError, match=r"labels and must lie in \[0, 1\]"):
        pacs_loss(logp, old, torch.tensor([2.0, 0, 0, 1]), mask, group_index=groups)


# ---------------------------------------------------------------- PPO pieces


def test_terminal_rewards_and_whiten():
    mask = torch.tensor([[1, 1, 0], [0, 1, 1], [0, 0, 0]])
    r = terminal_rewards(torch.tensor([2.0, -1.0, 5.0]), mask)
    assert r.tolist() == [[0.0, 2.0, 0.0], [0.0, 0.0, -1.0], [0.0, 0.0, 0.0]]
    x = torch.tensor([[1.0, 3.0, 99.0]])
    # masked values (1, 3): mean 2, unbiased std sqrt(2) -> (-1, 1) / sqrt(2); padding 0
    torch.testing.assert_close(
        whiten(x, torch.tensor([[1, 1, 0]])), torch.tensor([[-(0.5**0.5), 0.5**0.5, 0.0]])
    )


def test_ppo_advantages_closed_form():
    # one row, 2 tokens, outcome reward 1 on the last; V = (0.5, 0.25); gamma = 1, lam = 0.5
    # delta_1 = 1 - 0.25 = 0.75, A_1 = 0.75
    # delta_0 = 0 + 0.25 - 0.5 = -0.25, A_0 = -0.25 + 0.5 * 0.75 = 0.125
    values = torch.tensor([[0.5, 0.25]])
    adv, ret = ppo_advantages(torch.tensor([1.0]), values, torch.ones(1, 2), lam=0.5, normalize=False)
    torch.testing.assert_close(adv, torch.tensor([[0.125, 0.75]]))
    torch.testing.assert_close(ret, torch.tensor([[0.625, 1.0]]))


def test_ppo_loss_is_policy_plus_value_and_detaches_targets():
    logp = _leaf(torch.tensor([[-1.0, -2.0]]))
    old = logp.detach() - 0.1
    adv = torch.tensor([[0.5, -1.0]], dtype=F64)
    values = _leaf(torch.tensor([[0.3, 0.9]]))
    old_values = _leaf(torch.tensor([[0.2, 0.2]]))
    returns = _leaf(torch.tensor([[1.0, 0.0]]))
    mask = torch.ones(1, 2)
    loss, stats = ppo_loss(
        logp, old, adv, mask, values=values, old_values=old_values, returns=returns, vf_coef=0.5, vf_clip=0.2
    )
    expected = grpo_loss(logp, old, adv, mask)[0] + 0.5 * value_loss(values, old_values, returns, mask)[0]
    torch.testing.assert_close(loss, expected)
    assert {"clipfrac", "vf_loss", "vf_clipfrac", "value_mean"} <= set(stats)
    loss.backward()
    assert old_values.grad is None and returns.grad is None
    assert values.grad.abs().sum() > 0 and logp.grad.abs().sum() > 0
    with pytest.raises(ValueError, match=r"token advantages \(B, T\)"):
        ppo_loss(logp, old, adv[:, 0], mask, values=values, old_values=old_values, returns=returns)
