"""Loss and advantage variants (Dr. GRPO, DAPO, GSPO, CISPO, Lite PPO, RLOO, REINFORCE++, PPO value/GAE):
closed-form values worked out by hand, stop-gradients, and brute-force references."""

from __future__ import annotations

import math

import pytest
import torch

from schedrl.algos import (
    available,
    cispo_loss,
    dapo_loss,
    drgrpo_loss,
    gae,
    get,
    group_advantages,
    grpo_loss,
    gspo_loss,
    lite_ppo_advantages,
    overlong_reward_shaping,
    ppo_clip_loss,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
    value_loss,
)

LN = math.log
NEW_LOSSES = {"drgrpo": drgrpo_loss, "dapo": dapo_loss, "gspo": gspo_loss, "cispo": cispo_loss}
NEW_ADVANTAGES = {
    "lite_ppo": lite_ppo_advantages,
    "rloo": rloo_advantages,
    "reinforce_pp": reinforce_pp_advantages,
    "reinforce_pp_baseline": reinforce_pp_baseline_advantages,
}


def _ppo_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    # ratios rho = exp(logp - old_logp): row 0 = (1.5, 0.5, pad), row 1 = (1.5, 0.5, 1.0); A = (+1, -1)
    old = torch.tensor([[-1.0, -1.0, -1e4], [-2.0, -2.0, -2.0]])
    logp = old + torch.tensor([[LN(1.5), LN(0.5), 2e4], [LN(1.5), LN(0.5), 0.0]])  # pad: exp(2e4) = inf
    return logp, old, torch.tensor([1.0, -1.0]), torch.tensor([[1, 1, 0], [1, 1, 1]])


def test_registry_names_and_advantage_contract():
    for name, fn in NEW_LOSSES.items():
        assert get("loss", name) is fn and "\n" not in available("loss")[name]
    for name, fn in NEW_ADVANTAGES.items():
        assert get("advantage", name) is fn and "\n" not in available("advantage")[name]
    # the pipeline calls every estimator as fn(rewards, group_index, std_normalize=...)
    r, g = torch.tensor([1.0, 0.0, 3.0, 2.0]), torch.tensor([0, 0, 1, 1])
    for fn in NEW_ADVANTAGES.values():
        for std_normalize in (True, False):
            adv = fn(r.clone().requires_grad_(True), g, std_normalize=std_normalize)
            assert adv.shape == (4,) and not adv.requires_grad
        with pytest.raises(ValueError, match=r"\(N,\)"):
            fn(r, g[:3])
        with pytest.raises(ValueError, match="-1"):
            fn(r, g, eps=-1, std_normalize=True)


# ---------------------------------------------------------------- Dr. GRPO


def test_drgrpo_closed_form_and_kl():
    # eps = 0.2, token losses -min(rho A, clip(rho) A) (as in test_algos.test_ppo_clip_closed_form):
    # row 0: -1.2, -0.5; row 1: 1.5, 0.8, 1.0 -> sum = 1.6
    # max_tokens = B * max_len = 2 * 4 = 8 -> L = 1.6 / 8 = 0.2
    logp, old, adv, mask = _ppo_batch()
    loss, stats = drgrpo_loss(logp, old, adv, mask, max_tokens=8)
    torch.testing.assert_close(loss, torch.tensor(0.2))
    assert stats["clipfrac"] == pytest.approx(0.4)
    # max_tokens = number of valid tokens (5) gives the token mean: 1.6 / 5 = 0.32
    token_mean, _ = ppo_clip_loss(logp, old, adv, mask)
    torch.testing.assert_close(drgrpo_loss(logp, old, adv, mask, max_tokens=5)[0], token_mean)
    # KL with ref = old, k1 = -(ref - logp): sum = 2 ln 1.5 + 2 ln 0.5 = 2 ln 0.75 = -0.5753641
    # L = 0.2 + 0.5 * (-0.5753641) / 8 = 0.1640397; stats kl = token mean = -0.5753641 / 5 = -0.1150728
    loss, stats = drgrpo_loss(
        logp, old, adv, mask, max_tokens=8, ref_logp=old, kl_coef=0.5, kl_estimator="k1"
    )
    torch.testing.assert_close(loss, torch.tensor(0.1640397))
    assert stats["kl"] == pytest.approx(-0.1150728, abs=1e-6)
    for bad in (None, 0):
        with pytest.raises(ValueError, match="max_tokens"):
            drgrpo_loss(logp, old, adv, mask, max_tokens=bad)
    with pytest.raises(ValueError, match="ref_logp"):
        drgrpo_loss(logp, old, adv, mask, max_tokens=8, kl_coef=0.1)


def test_drgrpo_gradient_has_no_length_bias():
    # on-policy (rho = 1): d/dlogp_it [-A_i sum m / max_tokens] = -A_i / max_tokens for every valid token,
    # whatever the length of its row (seq_mean would give -A_i / (n_i * 2): 1/4 vs 1/6 here)
    logp = (-torch.rand(2, 3, generator=torch.Generator().manual_seed(0))).requires_grad_(True)
    adv = torch.tensor([0.7, -1.3])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    old = logp.detach().clone().requires_grad_(True)
    drgrpo_loss(logp, old, adv, mask, max_tokens=10)[0].backward()
    torch.testing.assert_close(logp.grad, -adv[:, None] * mask / 10)
    assert old.grad is None


# ---------------------------------------------------------------- DAPO


def test_dapo_is_clip_higher_token_mean():
    # per-token A = (+1, +1, -1, -1), rho = (1.25, 1.5, 0.75, 0.9), eps_low 0.2, eps_high 0.28 (defaults):
    # -1.25, -1.28 (clipped), 0.8 (clipped), 0.9 -> (-1.25 - 1.28 + 0.8 + 0.9) / 4 = -0.2075
    rho = torch.tensor([[1.25, 1.5, 0.75, 0.9]])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    loss, stats = dapo_loss(rho.log(), torch.zeros(1, 4), adv, torch.ones(1, 4))
    torch.testing.assert_close(loss, torch.tensor(-0.2075))
    assert stats["clipfrac"] == pytest.approx(0.5)
    logp, old, a, mask = _ppo_batch()
    expected, _ = grpo_loss(logp, old, a, mask, clip_eps_high=0.28, ref_logp=old, kl_coef=0.1)
    torch.testing.assert_close(dapo_loss(logp, old, a, mask, ref_logp=old, kl_coef=0.1)[0], expected)
    with pytest.raises(ValueError, match="seq_mean"):
        dapo_loss(logp, old, a, mask, agg="seq_mean")


def test_overlong_reward_shaping_table():
    # L_max = 20, L_cache = 4: free up to 16, then (16 - L) / 4, -1 beyond 20
    # L:       0   16    17     18    19     20   21   100
    # R_len:   0    0  -0.25  -0.5  -0.75   -1   -1    -1
    lengths = torch.tensor([0, 16, 17, 18, 19, 20, 21, 100])
    expected = torch.tensor([0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0, -1.0])
    torch.testing.assert_close(overlong_reward_shaping(lengths, max_len=20, cache_len=4), expected)
    # cache_len = max_len: the ramp covers the whole budget, L = 5 of 10 -> (0 - 5) / 10 = -0.5
    out = overlong_reward_shaping(torch.tensor([5.0]), max_len=10, cache_len=10)
    torch.testing.assert_close(out, torch.tensor([-0.5]))
    for cache_len in (0, 21):
        with pytest.raises(ValueError, match=f"cache_len={cache_len}"):
            overlong_reward_shaping(lengths, max_len=20, cache_len=cache_len)


# ---------------------------------------------------------------- GSPO


def _gspo_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    # row 0: 2 tokens, log ratios (ln 2, 0) -> s_0 = exp(ln 2 / 2) = sqrt 2 = 1.4142136, A = +1
    # row 1: 3 tokens, log ratios (ln 0.5, 0, 0) -> s_1 = 0.5^(1/3) = 0.7937005, A = -1
    old = torch.tensor([[-1.0, -2.0, 0.0], [-1.0, -1.0, -1.0]])
    logp = old + torch.tensor([[LN(2.0), 0.0, 50.0], [LN(0.5), 0.0, 0.0]])  # padding log ratio 50
    return logp, old, torch.tensor([1.0, -1.0]), torch.tensor([[1, 1, 0], [1, 1, 1]])


def test_gspo_closed_form():
    logp, old, adv, mask = _gspo_batch()
    # eps = 0.2: row 0 -min(1.4142, 1.2) = -1.2 (clipped); row 1 -min(-0.7937, -0.8) = 0.8 (clipped)
    # seq_mean = (-1.2 + 0.8) / 2 = -0.2; token_mean weighs by length: (2 (-1.2) + 3 (0.8)) / 5 = 0
    loss, stats = gspo_loss(logp, old, adv, mask, clip_eps=0.2, clip_eps_high=0.2)
    torch.testing.assert_close(loss, torch.tensor(-0.2))
    assert stats["clipfrac"] == 1.0 and stats["ratio_max"] == pytest.approx(2**0.5)
    assert stats["ratio_mean"] == pytest.approx((2**0.5 + 0.5 ** (1 / 3)) / 2)
    loss, _ = gspo_loss(logp, old, adv, mask, clip_eps=0.2, clip_eps_high=0.2, agg="token_mean")
    torch.testing.assert_close(loss, torch.tensor(0.0))
    # eps = 0.5: nothing clipped, L = (-1.4142136 + 0.7937005) / 2 = -0.3102565
    loss, stats = gspo_loss(logp, old, adv, mask, clip_eps=0.5, clip_eps_high=0.5)
    torch.testing.assert_close(loss, torch.tensor(-0.3102565))
    assert stats["clipfrac"] == 0.0
    with pytest.raises(ValueError, match=r"\(B,\)"):
        gspo_loss(logp, old, adv[:, None].expand(2, 3), mask)


def test_gspo_gradient_is_sequence_weighted_and_old_logp_gets_none():
    # L = (1/2) sum_i -s_i A_i, ds_i/dlogp_it = s_i / n_i -> grad_it = -A_i s_i / (2 n_i):
    # row 0: -1.4142136 / 4 = -0.3535534 per token; row 1: +0.7937005 / 6 = 0.1322834 per token; padding 0
    logp, old, adv, mask = _gspo_batch()
    logp.requires_grad_(True)
    old.requires_grad_(True)
    adv.requires_grad_(True)
    gspo_loss(logp, old, adv, mask, clip_eps=0.5, clip_eps_high=0.5)[0].backward()
    expected = torch.tensor([[-0.3535534, -0.3535534, 0.0], [0.1322834, 0.1322834, 0.1322834]])
    torch.testing.assert_close(logp.grad, expected)
    assert old.grad is None and adv.grad is None
    # both sequences clipped at eps = 0.2: no gradient at all
    logp.grad = None
    gspo_loss(logp, old, adv, mask, clip_eps=0.2, clip_eps_high=0.2)[0].backward()
    assert torch.all(logp.grad == 0)


def test_gspo_on_policy_equals_seq_mean_reinforce():
    # s = 1: grad = -A_i / (n_i |S|), the same as token-level PPO with agg="seq_mean"
    gen = torch.Generator().manual_seed(1)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    adv = torch.randn(3, generator=gen)
    grads = []
    for fn in (gspo_loss, ppo_clip_loss):
        logp = (-torch.rand(3, 4, generator=torch.Generator().manual_seed(2))).requires_grad_(True)
        fn(logp, logp.detach(), adv, mask, agg="seq_mean")[0].backward()
        grads.append(logp.grad)
    torch.testing.assert_close(grads[0], grads[1])


# ---------------------------------------------------------------- CISPO


def _cispo_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    # logp row 0 = (ln 0.5, ln 0.25), rho = (1.5, 6.0), A = 2; row 1 = (ln 0.5, pad), rho = 0.5, A = -1
    logp = torch.tensor([[LN(0.5), LN(0.25)], [LN(0.5), 1e4]])
    old = logp - torch.tensor([[LN(1.5), LN(6.0)], [LN(0.5), -1e4]])
    return logp, old, torch.tensor([2.0, -1.0]), torch.tensor([[1, 1], [1, 0]])


def test_cispo_closed_form():
    # defaults clip_eps = 1, clip_eps_high = 4: w = clip(rho, 0, 5) = (1.5, 5.0 | 0.5)
    # -w A logp: -1.5 * 2 * ln 0.5 = 2.0794415; -5 * 2 * ln 0.25 = 13.8629436; -0.5 * -1 * ln 0.5 = -0.3465736
    # token mean = (2.0794415 + 13.8629436 - 0.3465736) / 3 = 5.1986039
    logp, old, adv, mask = _cispo_batch()
    loss, stats = cispo_loss(logp, old, adv, mask)
    torch.testing.assert_close(loss, torch.tensor(5.1986039))
    assert stats["clipfrac"] == pytest.approx(1 / 3)  # only rho = 6
    assert stats["ratio_max"] == pytest.approx(6.0)
    with pytest.raises(ValueError, match="1.5"):
        cispo_loss(logp, old, adv, mask, clip_eps=1.5)


def test_cispo_weight_is_clipped_and_stop_gradient():
    # grad_t = -w_t A_t / 3 with w a constant:
    # defaults: w = (1.5, 5.0 | 0.5) -> (-3/3, -10/3 | 0.5/3) = (-1, -3.3333333 | 0.1666667)
    # had w = rho kept its gradient, the unclipped tokens would get -(rho + rho logp) A / 3 instead
    # (rho 0.5: -(0.5 - 0.3465736) * -1 / 3 = 0.0511421), so these values check the stop-gradient
    logp, old, adv, mask = _cispo_batch()
    logp.requires_grad_(True)
    old.requires_grad_(True)
    adv.requires_grad_(True)
    cispo_loss(logp, old, adv, mask)[0].backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.0, -3.3333333], [0.1666667, 0.0]]))
    assert old.grad is None and adv.grad is None
    # eps_low 0.2, eps_high 0.28: w = (1.28, 1.28 | 0.8) -> (-2.56/3, -2.56/3 | 0.8/3)
    logp.grad = None
    _, stats = cispo_loss(logp, old, adv, mask, clip_eps=0.2, clip_eps_high=0.28)
    cispo_loss(logp, old, adv, mask, clip_eps=0.2, clip_eps_high=0.28)[0].backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.8533333, -0.8533333], [0.2666667, 0.0]]))
    assert stats["clipfrac"] == 1.0
    # PPO-clip drops the rho = 6, A > 0 token entirely; CISPO keeps it with a capped weight
    logp.grad = None
    ppo_clip_loss(logp, old, adv, mask, clip_eps=0.2, clip_eps_high=0.28)[0].backward()
    assert logp.grad[0, 1] == 0 and logp.grad[0, 0] == 0


def test_cispo_on_policy_gradient_equals_ppo_and_kl_adds():
    logp = (-torch.rand(2, 3, generator=torch.Generator().manual_seed(3))).requires_grad_(True)
    adv, mask = torch.tensor([0.7, -1.3]), torch.tensor([[1, 1, 0], [1, 1, 1]])
    cispo_loss(logp, logp.detach(), adv, mask)[0].backward()
    torch.testing.assert_close(logp.grad, -adv[:, None] * mask / 5)  # rho = 1: -A / n_tokens
    ref = logp.detach() - 0.1  # d = ref - logp = -0.1 everywhere: k1 = 0.1 per token
    base, _ = cispo_loss(logp, logp.detach(), adv, mask)
    loss, stats = cispo_loss(logp, logp.detach(), adv, mask, ref_logp=ref, kl_coef=0.5, kl_estimator="k1")
    torch.testing.assert_close(loss, base + 0.5 * 0.1)
    assert stats["kl"] == pytest.approx(0.1)


# ---------------------------------------------------------------- critic-free advantages


def test_rloo_closed_form():
    # one group r = (1, 0, 0, 1): A_0 = 1 - (0 + 0 + 1)/3 = 2/3, A_1 = 0 - (1 + 0 + 1)/3 = -2/3
    #   (= n/(n-1) (r - mean) = 4/3 * +-0.5)
    r, g = torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.zeros(4, dtype=torch.long)
    a = 2 / 3
    torch.testing.assert_close(rloo_advantages(r, g), torch.tensor([a, -a, -a, a]))
    # whitened (TRL normalize_advantages): mean 0, unbiased std = sqrt(4 (4/9) / 3) = 0.7698004
    #   -> +-0.6666667 / 0.7699004 = +-0.8659129
    torch.testing.assert_close(
        rloo_advantages(r, g, std_normalize=True), torch.tensor([1, -1, -1, 1]) * 0.8659129
    )
    # mixed, unsorted groups: 7 = {2, 0}: A = 2 - 0 = 2, 0 - 2 = -2
    #   3 = {1, 2, 6}: 1 - (2 + 6)/2 = -3; 2 - (1 + 6)/2 = -1.5; 6 - (1 + 2)/2 = 4.5;  9 = {5}: no baseline, 0
    r = torch.tensor([2.0, 1.0, 0.0, 2.0, 6.0, 5.0])
    g = torch.tensor([7, 3, 7, 3, 3, 9])
    torch.testing.assert_close(rloo_advantages(r, g), torch.tensor([2.0, -3.0, -2.0, -1.5, 4.5, 0.0]))


# r = (4, 0, 1, 1), groups (0, 0, 1, 1): group means (2, 1), centred A~ = (2, -2, 0, 0);
# batch mean of r = 1.5, deviations (2.5, -1.5, -0.5, -0.5), sum of squares 9, unbiased var 3, std sqrt 3
_R, _G = torch.tensor([4.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1])


def test_reinforce_pp_global_normalisation():
    # A = (r - 1.5) / (sqrt 3 + 1e-4) = (2.5, -1.5, -0.5, -0.5) / 1.7321508
    #   = (1.4432923, -0.8659754, -0.2886585, -0.2886585); the group labels do not matter
    expected = torch.tensor([1.4432923, -0.8659754, -0.2886585, -0.2886585])
    torch.testing.assert_close(reinforce_pp_advantages(_R, _G), expected)
    torch.testing.assert_close(reinforce_pp_advantages(_R, torch.arange(4)), expected)
    torch.testing.assert_close(
        reinforce_pp_advantages(_R, _G, std_normalize=False), torch.tensor([2.5, -1.5, -0.5, -0.5])
    )


def test_reinforce_pp_baseline_vs_lite_ppo_vs_grpo():
    # all three centre on the group mean, A~ = (2, -2, 0, 0), and differ in the std:
    # REINFORCE++ baseline: batch std of A~ = sqrt((4 + 4) / 3) = 1.6329932 -> 2 / 1.6330932 = 1.2246699
    # Lite PPO:             batch std of raw r = sqrt 3 = 1.7320508          -> 2 / 1.7321508 = 1.1546339
    # GRPO:                 std of group 0 = sqrt 8 = 2.8284271; group 1: 0  -> 2 / 2.8285271 = 0.7070818
    for fn, a in (
        (reinforce_pp_baseline_advantages, 1.2246699),
        (lite_ppo_advantages, 1.1546339),
        (group_advantages, 0.7070818),
    ):
        torch.testing.assert_close(fn(_R, _G), torch.tensor([a, -a, 0.0, 0.0]))
        torch.testing.assert_close(fn(_R, _G, std_normalize=False), torch.tensor([2.0, -2.0, 0.0, 0.0]))


def test_single_sample_batch_has_zero_std_not_nan():
    for fn in NEW_ADVANTAGES.values():
        out = fn(torch.tensor([3.0]), torch.tensor([0]))
        assert torch.isfinite(out).all() and out.item() == 0.0


# ---------------------------------------------------------------- PPO: GAE and value loss


def test_gae_hand_worked_three_tokens():
    # r = (0, 0, 1) (outcome on the last token), V = (0.5, 0.6, 0.7)
    # gamma = 1, lam = 0.5:
    #   delta_2 = 1 + 0 - 0.7 = 0.3          A_2 = 0.3
    #   delta_1 = 0 + 0.7 - 0.6 = 0.1        A_1 = 0.1 + 0.5 * 0.3 = 0.25
    #   delta_0 = 0 + 0.6 - 0.5 = 0.1        A_0 = 0.1 + 0.5 * 0.25 = 0.225
    #   R = A + V = (0.725, 0.85, 1.0)
    # gamma = 0.5, lam = 1 (Monte-Carlo): R = discounted return (0.25, 0.5, 1.0),
    #   A = R - V = (-0.25, -0.1, 0.3)
    # row 1 is row 0 with padding (inf/NaN) inserted before, inside and after: same numbers on valid tokens
    r = torch.tensor([[0.0, 0.0, 1.0, 0.0, 0.0], [float("nan"), 0.0, float("inf"), 0.0, 1.0]])
    v = torch.tensor([[0.5, 0.6, 0.7, 0.0, 0.0], [float("inf"), 0.5, float("nan"), 0.6, 0.7]])
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 0, 1, 1]])
    adv, ret = gae(r, v, mask, gamma=1.0, lam=0.5)
    torch.testing.assert_close(adv[0, :3], torch.tensor([0.225, 0.25, 0.3]))
    torch.testing.assert_close(ret[0, :3], torch.tensor([0.725, 0.85, 1.0]))
    torch.testing.assert_close(adv[1, [1, 3, 4]], adv[0, :3])
    torch.testing.assert_close(ret[1, [1, 3, 4]], ret[0, :3])
    assert torch.all(adv[~mask.bool()] == 0) and torch.all(ret[~mask.bool()] == 0)
    adv, ret = gae(r, v, mask, gamma=0.5, lam=1.0)
    torch.testing.assert_close(adv[0, :3], torch.tensor([-0.25, -0.1, 0.3]))
    torch.testing.assert_close(ret[0, :3], torch.tensor([0.25, 0.5, 1.0]))
    with pytest.raises(ValueError, match="lam=1.5"):
        gae(r, v, mask, lam=1.5)


def _gae_brute_force(r, v, mask, gamma, lam):
    adv = torch.zeros_like(r)
    for i in range(r.shape[0]):
        idx = [t for t in range(r.shape[1]) if mask[i, t]]  # the valid tokens, in order
        running = 0.0
        for k in reversed(range(len(idx))):
            t = idx[k]
            next_v = v[i, idx[k + 1]].item() if k + 1 < len(idx) else 0.0
            delta = r[i, t].item() + gamma * next_v - v[i, t].item()
            running = delta + gamma * lam * running
            adv[i, t] = running
    return adv, (adv + v) * mask


def test_gae_matches_brute_force_and_ignores_padding():
    gen = torch.Generator().manual_seed(0)
    r = torch.randn(6, 9, generator=gen, dtype=torch.float64)
    v = torch.randn(6, 9, generator=gen, dtype=torch.float64)
    mask = torch.rand(6, 9, generator=gen) < 0.7  # holes anywhere
    mask[0] = False  # an empty row
    mask[1] = True  # a full row
    for gamma, lam in ((1.0, 0.95), (0.9, 0.8), (0.99, 0.0)):
        adv, ret = gae(r, v, mask, gamma=gamma, lam=lam)
        ref_adv, ref_ret = _gae_brute_force(r, v, mask, gamma, lam)
        torch.testing.assert_close(adv, ref_adv)
        torch.testing.assert_close(ret, ref_ret)
        junk = torch.where(mask, 0.0, torch.randn(6, 9, generator=gen, dtype=torch.float64) * 1e6)
        adv2, ret2 = gae(r + junk, v - junk, mask, gamma=gamma, lam=lam)
        assert torch.equal(adv2, adv) and torch.equal(ret2, ret)


def test_gae_outputs_are_detached():
    v = torch.zeros(1, 2, requires_grad=True)
    adv, ret = gae(torch.ones(1, 2), v, torch.ones(1, 2))
    assert not adv.requires_grad and not ret.requires_grad


def test_value_loss_clipped_closed_form_and_gradients():
    # eps = 0.2, V_clip = V_old + clip(V - V_old, -0.2, 0.2):
    # t0: V 1.0, V_old 0.5 -> V_clip 0.7, R 2.0: (1 - 2)^2 = 1, (0.7 - 2)^2 = 1.69 -> 1.69 (clipped, grad 0)
    # t1: V 2.0, V_old 2.1 -> V_clip 2.0, R 1.0: 1 and 1                              -> 1
    # t2: V 0.0, V_old 0.5 -> V_clip 0.3, R 0.3: 0.09 and 0                           -> 0.09
    # t3: padding (inf)
    # L = 0.5 (1.69 + 1 + 0.09) / 3 = 0.4633333; unclipped: 0.5 (1 + 1 + 0.09) / 3 = 0.3483333
    # grad = 0.5 * 2 (V - R) / 3 where unclipped is taken: (0, 1/3, -0.1, 0)
    values = torch.tensor([[1.0, 2.0, 0.0, float("inf")]], requires_grad=True)
    old = torch.tensor([[0.5, 2.1, 0.5, float("inf")]], requires_grad=True)
    ret = torch.tensor([[2.0, 1.0, 0.3, float("nan")]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, stats = value_loss(values, old, ret, mask, clip_range=0.2)
    torch.testing.assert_close(loss, torch.tensor(0.4633333))
    assert stats["vf_clipfrac"] == pytest.approx(1 / 3) and stats["value_mean"] == pytest.approx(1.0)
    loss.backward()
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, 1 / 3, -0.1, 0.0]]))
    assert old.grad is None and ret.grad is None
    loss, stats = value_loss(values, old, ret, mask, clip_range=None)
    torch.testing.assert_close(loss, torch.tensor(0.3483333))
    assert stats["vf_clipfrac"] == 0.0
    with pytest.raises(ValueError, match="-0.1"):
        value_loss(values, old, ret, mask, clip_range=-0.1)


def test_ppo_with_gae_token_advantages_runs_end_to_end():
    # gae's (B, T) advantages feed ppo_clip_loss directly; on-policy grad = -A_t / n_tokens
    r = torch.tensor([[0.0, 0.0, 1.0], [0.0, -1.0, 0.0]])
    v = torch.tensor([[0.5, 0.6, 0.7], [0.1, 0.2, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, _ = gae(r, v, mask, gamma=1.0, lam=0.5)
    logp = torch.full((2, 3), -1.0, requires_grad=True)
    ppo_clip_loss(logp, logp.detach(), adv, mask)[0].backward()
    torch.testing.assert_close(logp.grad, -adv / 5)
