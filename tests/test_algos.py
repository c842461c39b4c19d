"""schedrl.algos: closed-form values worked out by hand, stop-gradients, and peer references."""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributions import Categorical

from schedrl.algos import (
    available,
    entropy_from_logits,
    get,
    group_advantages,
    group_stats,
    grpo_loss,
    kl_penalty,
    masked_mean,
    ppo_clip_loss,
    register,
    registry,
    token_logprobs,
)
from schedrl.algos.losses import ClipArgs
from schedrl.algos.spec import LossSpec

LN = math.log


def test_group_advantages_one_group_closed_form():
    # r = [1, 0, 0, 1]: mean 0.5, deviations +-0.5, sum of squares 1, unbiased var 1/3,
    # std = sqrt(1/3) = 0.5773503 -> A = +-0.5 / (0.5773503 + 1e-4) = +-0.8658754
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    g = torch.zeros(4, dtype=torch.long)
    a = 0.8658754
    torch.testing.assert_close(group_advantages(r, g), torch.tensor([a, -a, -a, a]))
    # std_normalize=False: A = r - mean = +-0.5
    torch.testing.assert_close(
        group_advantages(r, g, std_normalize=False), torch.tensor([0.5, -0.5, -0.5, 0.5])
    )


def test_group_advantages_mixed_groups():
    # labels are unsorted and non-contiguous:
    # group 7: r = {2, 0}: mean 1, dev +-1, var = 2 / 1, std = sqrt(2)  -> A = +-1 / (1.41421 + 1e-4) = +-0.7070568
    # group 3: r = {1, 2, 6}: mean 3, dev (-2, -1, 3), sumsq 14, var 14 / 2 = 7, std = sqrt(7) = 2.6457513
    #          -> A = (-2, -1, 3) / 2.6458513 = (-0.7559004, -0.3779502, 1.1338506)
    # group 9: one sample -> std 0, A = 0
    # group 4: r = {0.3, 0.3, 0.3}: all equal -> A = 0 exactly (no 0/eps blow-up of round-off)
    r = torch.tensor([2.0, 1.0, 0.0, 2.0, 6.0, 5.0, 0.3, 0.3, 0.3])
    g = torch.tensor([7, 3, 7, 3, 3, 9, 4, 4, 4])
    expected = torch.tensor([0.7070568, -0.7559004, -0.7070568, -0.3779502, 1.1338506, 0.0, 0.0, 0.0, 0.0])
    adv = group_advantages(r, g)
    torch.testing.assert_close(adv, expected)
    assert torch.all(adv[5:] == 0)
    mean, std = group_stats(r, g)
    torch.testing.assert_close(mean, torch.tensor([1.0, 3, 1, 3, 3, 5, 0.3, 0.3, 0.3]))
    torch.testing.assert_close(std, torch.tensor([2**0.5, 7**0.5, 2**0.5, 7**0.5, 7**0.5, 0, 0, 0, 0]))
    assert torch.all(std[5:] == 0)


def test_group_advantages_matches_trl_reshape_and_is_permutation_invariant():
    gen = torch.Generator().manual_seed(0)
    r = torch.rand(6 * 8, generator=gen)
    g = torch.arange(6).repeat_interleave(8)
    view = r.view(-1, 8)  # TRL: (r - mean) / (std + 1e-4) with unbiased std over each row
    ref = ((view - view.mean(1, keepdim=True)) / (view.std(1, keepdim=True) + 1e-4)).flatten()
    torch.testing.assert_close(group_advantages(r, g), ref)
    perm = torch.randperm(r.numel(), generator=gen)
    torch.testing.assert_close(group_advantages(r[perm], g[perm]), ref[perm])


def test_group_advantages_detaches_and_validates():
    r = torch.tensor([1.0, 0.0], requires_grad=True)
    assert not group_advantages(r, torch.tensor([0, 0])).requires_grad
    with pytest.raises(ValueError, match=r"\(N,\)"):
        group_advantages(r, torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match="integer"):
        group_advantages(r, torch.tensor([0.0, 0.0]))


def test_masked_mean_token_and_seq_and_empty():
    x = torch.tensor([[1.0, 3.0, 99.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    # token_mean: (1 + 3 + 4 + 5 + 6) / 5 = 19 / 5 = 3.8
    torch.testing.assert_close(masked_mean(x, mask), torch.tensor(3.8))
    # seq_mean over non-empty rows: (2 + 5) / 2 = 3.5; the empty row is skipped, not averaged in as 0
    torch.testing.assert_close(masked_mean(x, mask, "seq_mean"), torch.tensor(3.5))
    x = torch.full((2, 3), float("inf"), requires_grad=True)
    for agg in ("token_mean", "seq_mean"):
        out = masked_mean(x, torch.zeros(2, 3), agg)
        assert out.item() == 0.0
        out.backward()
        assert torch.all(x.grad == 0)
    with pytest.raises(ValueError, match="valid: token_mean, seq_mean"):
        masked_mean(x, mask, "sum")


def _ppo_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    # ratios rho = exp(logp - old_logp): row 0 = (1.5, 0.5, pad), row 1 = (1.5, 0.5, 1.0); A = (+1, -1)
    old = torch.tensor([[-1.0, -1.0, -1e4], [-2.0, -2.0, -2.0]])
    logp = old + torch.tensor([[LN(1.5), LN(0.5), 2e4], [LN(1.5), LN(0.5), 0.0]])  # pad: exp(2e4) = inf
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    return logp, old, adv, mask


def test_ppo_clip_closed_form():
    # eps = 0.2, L = -min(rho A, clip(rho, 0.8, 1.2) A):
    # row 0, A=+1: rho 1.5 -> -min(1.5, 1.2) = -1.2 (clipped); rho 0.5 -> -min(0.5, 0.8) = -0.5
    # row 1, A=-1: rho 1.5 -> -min(-1.5, -1.2) = 1.5; rho 0.5 -> -min(-0.5, -0.8) = 0.8 (clipped);
    #              rho 1.0 -> 1.0
    # token_mean = (-1.2 - 0.5 + 1.5 + 0.8 + 1.0) / 5 = 0.32
    # seq_mean = ((-1.2 - 0.5) / 2 + (1.5 + 0.8 + 1.0) / 3) / 2 = (-0.85 + 1.1) / 2 = 0.125
    logp, old, adv, mask = _ppo_batch()
    loss, stats = ppo_clip_loss(logp, old, adv, mask, clip_eps=0.2)
    torch.testing.assert_close(loss, torch.tensor(0.32))
    loss_seq, _ = ppo_clip_loss(logp, old, adv, mask, clip_eps=0.2, agg="seq_mean")
    torch.testing.assert_close(loss_seq, torch.tensor(0.125))
    # clipfrac = 2 / 5; ratio_mean = (1.5 + 0.5 + 1.5 + 0.5 + 1) / 5 = 1; ratio_max = 1.5 (padding ignored)
    # approx_kl = mean(old - logp) = -(2 ln 1.5 + 2 ln 0.5) / 5 = -2 ln 0.75 / 5 = 0.1150728
    assert stats["clipfrac"] == pytest.approx(0.4)
    assert stats["ratio_mean"] == pytest.approx(1.0)
    assert stats["ratio_max"] == pytest.approx(1.5)
    assert stats["approx_kl"] == pytest.approx(0.1150728, abs=1e-6)
    assert all(isinstance(v, float) for v in stats.values())
    # adv given per token (B, T) gives the same loss
    loss_bt, _ = ppo_clip_loss(logp, old, adv[:, None].expand(2, 3), mask)
    torch.testing.assert_close(loss_bt, loss)


def test_ppo_clip_higher_asymmetric():
    # per-token A = (+1, +1, -1, -1), rho = (1.25, 1.5, 0.75, 0.9), eps_low = 0.2:
    # eps_high = 0.28: -min(1.25, 1.25) = -1.25; -min(1.5, 1.28) = -1.28 (clipped);
    #                  -min(-0.75, -0.8) = 0.8 (clipped); 0.9 -> loss (-1.25 - 1.28 + 0.8 + 0.9) / 4 = -0.2075
    # eps_high = 0.2:  -1.2 (clipped), -1.2 (clipped), 0.8 (clipped), 0.9 -> (-1.2 - 1.2 + 0.8 + 0.9) / 4 = -0.175
    rho = torch.tensor([[1.25, 1.5, 0.75, 0.9]])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    mask = torch.ones(1, 4)
    old = torch.zeros(1, 4)
    loss, stats = ppo_clip_loss(rho.log(), old, adv, mask, clip_eps=0.2, clip_eps_high=0.28)
    torch.testing.assert_close(loss, torch.tensor(-0.2075))
    assert stats["clipfrac"] == pytest.approx(0.5)
    loss, stats = ppo_clip_loss(rho.log(), old, adv, mask, clip_eps=0.2)
    torch.testing.assert_close(loss, torch.tensor(-0.175))
    assert stats["clipfrac"] == pytest.approx(0.75)
    with pytest.raises(ValueError, match="1.5"):
        ppo_clip_loss(rho.log(), old, adv, mask, clip_eps=1.5)


def test_gradient_flows_to_logp_only():
    logp, old, adv, mask = _ppo_batch()
    logp = logp.clone().requires_grad_(True)
    old.requires_grad_(True)
    adv.requires_grad_(True)
    ref = (logp.detach() - 0.1).requires_grad_(True)
    loss, stats = grpo_loss(logp, old, adv, mask, ref_logp=ref, kl_coef=0.1)
    loss.backward()
    assert old.grad is None and adv.grad is None and ref.grad is None
    assert torch.isfinite(logp.grad).all()
    assert logp.grad[0, 2] == 0  # padding (whose ratio would be inf) gets no gradient
    assert "kl" in stats


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean"])
def test_on_policy_gradient_is_reinforce(agg):
    # old_logp == logp: rho = 1, d/dlogp (-rho A) = -A, so
    # token_mean: grad = -A_i m_it / sum(m) = -A_i m_it / 5
    # seq_mean:   grad = -A_i m_it / (n_i * n_seq) = -A_i m_it / (n_i * 2), n = (2, 3)
    torch.manual_seed(0)
    logp = (-torch.rand(2, 3)).requires_grad_(True)
    adv = torch.tensor([0.7, -1.3])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss, stats = ppo_clip_loss(logp, logp.detach(), adv, mask, agg=agg)
    loss.backward()
    denom = 5.0 if agg == "token_mean" else torch.tensor([[2.0 * 2], [3.0 * 2]])
    torch.testing.assert_close(logp.grad, -adv[:, None] * mask / denom)
    assert stats["clipfrac"] == 0.0 and stats["approx_kl"] == 0.0 and stats["ratio_max"] == 1.0


def test_gradcheck_float64():
    torch.manual_seed(0)
    old = -torch.rand(3, 4, dtype=torch.float64)
    # rho in [0.9, 1.1]: away from the clip boundary 1 +- 0.2
    logp = (old + (torch.rand(3, 4, dtype=torch.float64) * 0.2 - 0.1)).requires_grad_(True)
    adv = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    for agg in ("token_mean", "seq_mean"):
        assert torch.autograd.gradcheck(
            lambda lp, agg=agg: ppo_clip_loss(lp, old, adv, mask, agg=agg)[0], logp
        )
    assert torch.autograd.gradcheck(lambda lp: kl_penalty(lp, old, "k3"), logp)
    logits = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(entropy_from_logits, logits)


def test_grpo_loss_adds_kl_and_requires_ref():
    logp, old, adv, mask = _ppo_batch()
    ref = old.clone()  # d = ref - logp: row 0 = (-ln 1.5, -ln 0.5), row 1 = (-ln 1.5, -ln 0.5, 0)
    base, _ = ppo_clip_loss(logp, old, adv, mask)
    loss, stats = grpo_loss(logp, old, adv, mask, ref_logp=ref, kl_coef=0.5, kl_estimator="k1")
    # k1 = -d, token mean = (2 ln 1.5 + 2 ln 0.5) / 5 = 2 ln 0.75 / 5 = -0.1150728
    assert stats["kl"] == pytest.approx(-0.1150728, abs=1e-6)
    torch.testing.assert_close(loss, base + 0.5 * -0.1150728)
    no_kl, stats = grpo_loss(logp, old, adv, mask)
    torch.testing.assert_close(no_kl, base)
    assert "kl" not in stats
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(logp, old, adv, mask, kl_coef=0.1)
    with pytest.raises(ValueError, match="valid: k1, k2, k3"):
        grpo_loss(logp, old, adv, mask, kl_estimator="k4")


def test_kl_estimators_closed_form():
    # pi = 0.5, pi_ref = 0.25: d = ln(0.25 / 0.5) = -ln 2 = -0.6931472
    #   k1 = -d = 0.6931472; k2 = d^2 / 2 = 0.2402265; k3 = e^d - d - 1 = 0.5 + 0.6931472 - 1 = 0.1931472
    # pi = 0.25, pi_ref = 0.5: d = ln 2 -> k1 = -0.6931472, k3 = 2 - 0.6931472 - 1 = 0.3068528
    logp = torch.tensor([[LN(0.5), LN(0.25)]])
    ref = torch.tensor([[LN(0.25), LN(0.5)]])
    torch.testing.assert_close(kl_penalty(logp, ref, "k1"), torch.tensor([[0.6931472, -0.6931472]]))
    torch.testing.assert_close(kl_penalty(logp, ref, "k2"), torch.tensor([[0.2402265, 0.2402265]]))
    torch.testing.assert_close(kl_penalty(logp, ref, "k3"), torch.tensor([[0.1931472, 0.3068528]]))
    for est in ("k1", "k2", "k3"):
        assert torch.all(kl_penalty(logp, logp, est) == 0)
    big = torch.randn(64, 64) * 5
    assert torch.all(kl_penalty(big, torch.randn(64, 64) * 5, "k3") >= 0)
    with pytest.raises(ValueError, match="valid: k1, k2, k3"):
        kl_penalty(logp, ref, "k5")


def test_k3_is_unbiased_for_kl():
    # KL(p || q) = sum p ln(p / q) with p = (.1, .2, .3, .4), q = reversed
    #            = .1 ln .25 + .2 ln(2/3) + .3 ln 1.5 + .4 ln 4 = 0.4564348
    p = torch.tensor([0.1, 0.2, 0.3, 0.4])
    q = p.flip(0)
    gen = torch.Generator().manual_seed(0)
    x = torch.multinomial(p, 200_000, replacement=True, generator=gen)
    logp, ref = p.log()[x][None], q.log()[x][None]  # (1, n) samples from p
    for est in ("k1", "k3"):
        assert kl_penalty(logp, ref, est).mean().item() == pytest.approx(0.4564348, abs=0.02)


def test_entropy_and_logprobs_match_categorical():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 7) * 3
    logits[0, 0, :3] = float("-inf")  # a masked vocabulary contributes 0 * log 0 = 0
    torch.testing.assert_close(entropy_from_logits(logits), Categorical(logits=logits).entropy())
    tokens = torch.randint(3, 7, (2, 3))
    for temp in (1.0, 0.7, 1.6):
        expected = Categorical(logits=logits / temp).log_prob(tokens)
        torch.testing.assert_close(token_logprobs(logits, tokens, temperature=temp), expected)
    with pytest.raises(ValueError, match="-1"):
        token_logprobs(logits, tokens, temperature=-1)


def test_registry(monkeypatch):
    assert get("advantage", "grpo") is group_advantages
    assert get("loss", "grpo") is grpo_loss
    assert get("loss", "ppo_clip") is ppo_clip_loss
    assert set(available("loss")) >= {"grpo", "ppo_clip"} and "grpo" in available("advantage")
    with pytest.raises(
        ValueError, match=r"unknown loss 'dpo'; valid: cispo, .*, drgrpo, grpo, gspo, .*ppo_clip"
    ):
        get("loss", "dpo")
    with pytest.raises(ValueError, match="valid: advantage, loss"):
        get("reward", "grpo")
    monkeypatch.setattr(registry.LOSSES, "_entries", dict(registry.LOSSES._entries))
    register("loss", "mine", "a test loss", LossSpec(args=ClipArgs))(ppo_clip_loss)
    assert available("loss")["mine"] == "a test loss"
    assert registry.loss_spec("mine").keywords() == {"agg", "clip_eps", "clip_eps_high"}
    with pytest.raises(ValueError, match="already registered"):
        register("loss", "mine", "again", LossSpec())(grpo_loss)
    with pytest.raises(ValueError, match="registered with a LossSpec"):
        register("loss", "no_spec", "a loss without its spec")(grpo_loss)
