"""schedrl losses and advantages against TRL on identical float64 tensors.

No GRPOTrainer is built. ``GRPOTrainer._compute_loss`` is called unbound on a ``SimpleNamespace``
carrying the attributes it reads, with a stub for ``_get_per_token_logps_and_entropies`` returning
per-token log-probs we own, so TRL's own loss code runs and its gradient lands on our leaf tensor.
TRL computes advantages inline in ``_generate_and_score_completions``; those few lines are transcribed
below with TRL's own ``nanstd``. Where the two differ by design a test asserts the difference.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("trl")

from trl.trainer.grpo_trainer import GRPOTrainer  # noqa: E402
from trl.trainer.utils import nanstd  # noqa: E402

from schedrl.algos import (  # noqa: E402
    cispo_loss,
    dapo_loss,
    drgrpo_loss,
    group_advantages,
    grpo_loss,
    gspo_loss,
    lite_ppo_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)

TOL = {"rtol": 0.0, "atol": 1e-12}  # float64 on both sides: agreement to round-off
# TRL's nanstd computes Bessel's factor count / (count - 1) from integer tensors, i.e. in float32, so a
# float64 std carries a ~1e-8 relative error on TRL's side; advantages agree to that, not to round-off.
ADV_TOL = {"rtol": 0.0, "atol": 1e-6}
B, T, MAX_LEN = 4, 6, 8


class _Accelerator:  # one process: gather and reduce are the identity
    num_processes = 1

    def gather(self, x):
        return x

    def gather_for_metrics(self, x):
        return x

    def reduce(self, x, reduction="sum"):
        return x


def trl_loss(
    logp,
    old,
    adv,
    mask,
    *,
    loss_type,
    epsilon=0.2,
    epsilon_high=None,
    beta=0.0,
    ref=None,
    level="token",
    num_items=None,
    delta=None,
    bias_correction_kl=False,
):
    """TRL's GRPO loss on our tensors; returns (loss, d loss / d logp)."""
    leaf = logp.detach().clone().requires_grad_(True)
    stub = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (leaf, torch.zeros_like(leaf.detach()), None),
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level=level,
        beta=beta,
        args=SimpleNamespace(use_bias_correction_kl=bias_correction_kl, delta=delta, steps_per_generation=1),
        loss_type=loss_type,
        epsilon_low=epsilon,
        epsilon_high=epsilon if epsilon_high is None else epsilon_high,  # as GRPOTrainer.__init__
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=MAX_LEN,
        accelerator=_Accelerator(),
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )
    n = logp.shape[0]
    inputs = {
        "prompt_ids": torch.zeros(n, 1, dtype=torch.long),
        "prompt_mask": torch.ones(n, 1, dtype=torch.long),
        "completion_ids": torch.zeros(n, logp.shape[1], dtype=torch.long),
        "completion_mask": mask,
        "advantages": adv,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": mask.sum().to(logp.dtype) if num_items is None else torch.tensor(num_items),
    }
    loss = GRPOTrainer._compute_loss(stub, None, inputs)
    loss.backward()
    return loss.detach(), leaf.grad


def ours(fn, logp, *args, **kw):
    leaf = logp.detach().clone().requires_grad_(True)
    loss, _ = fn(leaf, *args, **kw)
    loss.backward()
    return loss.detach(), leaf.grad


def _batch(seed=0, scale=0.3, empty_row=False):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([6, 1, 4, 3])  # unequal lengths, so seq_mean, token_mean and dr_grpo all differ
    if empty_row:
        lengths[1] = 0
    mask = (torch.arange(T)[None] < lengths[:, None]).long()  # (B, T), int like TRL's completion_mask
    old = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 2
    logp = old + torch.randn(B, T, generator=gen, dtype=torch.float64) * scale  # rho mostly within 0.5..2
    ref = old + torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.2
    adv = torch.randn(B, generator=gen, dtype=torch.float64)
    return logp, old, adv, mask, ref


def _assert_same(a, b):
    torch.testing.assert_close(a[0], b[0], **TOL)
    torch.testing.assert_close(a[1], b[1], **TOL)
    assert a[1].abs().sum() > 0  # the comparison is not vacuous


EPS = [(0.2, None), (0.2, 0.28), (0.1, 0.5)]
BETAS = [0.0, 0.04]


@pytest.mark.parametrize("eps,eps_high", EPS)
@pytest.mark.parametrize("beta", BETAS)
def test_grpo_seq_mean_matches_trl_grpo(eps, eps_high, beta):
    # TRL loss_type="grpo": per-sequence mean, then batch mean = our agg="seq_mean"; beta adds k3 KL
    logp, old, adv, mask, ref = _batch()
    trl = trl_loss(
        logp, old, adv, mask, loss_type="grpo", epsilon=eps, epsilon_high=eps_high, beta=beta, ref=ref
    )
    mine = ours(
        grpo_loss,
        logp,
        old,
        adv,
        mask,
        clip_eps=eps,
        clip_eps_high=eps_high,
        agg="seq_mean",
        ref_logp=ref,
        kl_coef=beta,
        kl_estimator="k3",
    )
    _assert_same(trl, mine)


@pytest.mark.parametrize("eps,eps_high", EPS)
@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("loss_type", ["dapo", "bnpo"])
def test_dapo_token_mean_matches_trl_dapo_and_bnpo(eps, eps_high, beta, loss_type):
    # TRL "dapo": token sum / num_items_in_batch (= this batch's tokens with one process and no
    # accumulation); "bnpo": token mean of the local batch. Both = our dapo / token_mean grpo.
    logp, old, adv, mask, ref = _batch(seed=1)
    trl = trl_loss(
        logp, old, adv, mask, loss_type=loss_type, epsilon=eps, epsilon_high=eps_high, beta=beta, ref=ref
    )
    mine = ours(
        dapo_loss, logp, old, adv, mask, clip_eps=eps, clip_eps_high=eps_high, ref_logp=ref, kl_coef=beta
    )
    _assert_same(trl, mine)


@pytest.mark.parametrize("eps,eps_high", EPS)
@pytest.mark.parametrize("beta", BETAS)
def test_drgrpo_matches_trl_dr_grpo(eps, eps_high, beta):
    # TRL "dr_grpo": token sum / (B * max_completion_length) = our drgrpo with max_tokens = B * MAX_LEN
    logp, old, adv, mask, ref = _batch(seed=2)
    trl = trl_loss(
        logp, old, adv, mask, loss_type="dr_grpo", epsilon=eps, epsilon_high=eps_high, beta=beta, ref=ref
    )
    mine = ours(
        drgrpo_loss,
        logp,
        old,
        adv,
        mask,
        max_tokens=B * MAX_LEN,
        clip_eps=eps,
        clip_eps_high=eps_high,
        ref_logp=ref,
        kl_coef=beta,
    )
    _assert_same(trl, mine)


@pytest.mark.parametrize("eps,eps_high", [(3e-4, 4e-4), (0.05, 0.08), (0.2, 0.28)])
@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("loss_type,agg", [("grpo", "seq_mean"), ("dapo", "token_mean")])
def test_gspo_matches_trl_sequence_level(eps, eps_high, beta, loss_type, agg):
    # TRL importance_sampling_level="sequence": s_i = exp(masked mean of log rho), (B, 1);
    # loss_type "grpo" averages sequences (= GSPO paper), "dapo" weighs them by length
    logp, old, adv, mask, ref = _batch(seed=3, scale=0.1)
    trl = trl_loss(
        logp,
        old,
        adv,
        mask,
        loss_type=loss_type,
        epsilon=eps,
        epsilon_high=eps_high,
        beta=beta,
        ref=ref,
        level="sequence",
    )
    mine = ours(
        gspo_loss,
        logp,
        old,
        adv,
        mask,
        clip_eps=eps,
        clip_eps_high=eps_high,
        agg=agg,
        ref_logp=ref,
        kl_coef=beta,
    )
    _assert_same(trl, mine)


@pytest.mark.parametrize("cap", [5.0, 1.28, 1.05])
@pytest.mark.parametrize("beta", BETAS)
def test_cispo_matches_trl_with_mapped_epsilon(cap, beta):
    # TRL "cispo": w = sg(min(rho, epsilon_high)), epsilon_high an absolute cap, no lower clip.
    # Ours: w = sg(clip(rho, 1 - clip_eps, 1 + clip_eps_high)) -> clip_eps = 1, clip_eps_high = cap - 1
    logp, old, adv, mask, ref = _batch(seed=4, scale=0.8)  # rho up to ~e^2: the caps bind
    trl = trl_loss(logp, old, adv, mask, loss_type="cispo", epsilon_high=cap, beta=beta, ref=ref)
    mine = ours(
        cispo_loss, logp, old, adv, mask, clip_eps=1.0, clip_eps_high=cap - 1.0, ref_logp=ref, kl_coef=beta
    )
    _assert_same(trl, mine)
    assert ((logp - old).exp() * mask > cap).any()  # some weight was capped


# ---------------------------------------------------------------- differences by design


def test_difference_empty_completion_in_seq_mean():
    # A row with no completion tokens: TRL "grpo" averages per-sequence means over all B rows (the empty
    # row counts as 0); our seq_mean averages over the |S| = 3 non-empty rows, so an empty completion does
    # not shrink everyone else's gradient. TRL = ours * |S| / B.
    logp, old, adv, mask, ref = _batch(seed=5, empty_row=True)
    trl = trl_loss(logp, old, adv, mask, loss_type="grpo")
    mine = ours(grpo_loss, logp, old, adv, mask, agg="seq_mean")
    torch.testing.assert_close(trl[0], mine[0] * 3 / 4, **TOL)
    torch.testing.assert_close(trl[1], mine[1] * 3 / 4, **TOL)
    assert not torch.allclose(trl[0], mine[0])


def test_difference_dapo_normaliser_spans_the_accumulation_window():
    # TRL "dapo"/"cispo" divide by num_items_in_batch, the tokens of the whole generation batch; ours
    # divides by this call's tokens and leaves the micro-batch weighting to the learner (its `share`).
    # With a window twice as large TRL's per-call loss is half of ours.
    logp, old, adv, mask, _ = _batch(seed=6)
    n = int(mask.sum())
    trl = trl_loss(logp, old, adv, mask, loss_type="dapo", num_items=2.0 * n)
    mine = ours(dapo_loss, logp, old, adv, mask, clip_eps_high=None)
    torch.testing.assert_close(trl[0], mine[0] / 2, **TOL)


def test_difference_cispo_epsilon_high_is_absolute_in_trl():
    # The same number means different things: TRL epsilon_high = 0.28 caps the weight at 0.28 (< 1, so
    # every token is down-weighted); our clip_eps_high = 0.28 caps it at 1.28. And our clip_eps = 0.2
    # floors the weight at 0.8, which TRL never does.
    logp, old, adv, mask, _ = _batch(seed=7, scale=0.8)
    trl = trl_loss(logp, old, adv, mask, loss_type="cispo", epsilon_high=0.28)
    mine = ours(cispo_loss, logp, old, adv, mask, clip_eps=0.2, clip_eps_high=0.28)
    assert not torch.allclose(trl[1], mine[1])
    rho = (logp - old).exp()
    torch.testing.assert_close(trl[1], -(rho.clamp(max=0.28) * adv[:, None] * mask) / mask.sum(), **TOL)


def test_difference_trl_only_options_change_the_loss():
    # Options schedrl does not have: TRL's use_bias_correction_kl (KL_t * rho_t) and delta (INTELLECT-2's
    # extra cap on rho for negative advantages). Off-policy, each makes TRL differ from ours.
    logp, old, adv, mask, ref = _batch(seed=8, scale=0.8)
    mine = ours(grpo_loss, logp, old, adv, mask, agg="seq_mean", ref_logp=ref, kl_coef=0.04)
    base = trl_loss(logp, old, adv, mask, loss_type="grpo", beta=0.04, ref=ref)
    torch.testing.assert_close(base[0], mine[0], **TOL)
    biased = trl_loss(logp, old, adv, mask, loss_type="grpo", beta=0.04, ref=ref, bias_correction_kl=True)
    capped = trl_loss(logp, old, adv, mask, loss_type="grpo", beta=0.04, ref=ref, delta=1.5)
    assert not torch.allclose(biased[0], mine[0]) and not torch.allclose(capped[0], mine[0])


# ---------------------------------------------------------------- advantages


def trl_grpo_advantages(rewards, num_generations, scale_rewards):
    """GRPOTrainer._generate_and_score_completions, "sum_then_normalize" branch, one process."""
    mean = torch.nanmean(rewards.view(-1, num_generations), dim=1).repeat_interleave(num_generations)
    if scale_rewards in ("group", "none"):
        std = nanstd(rewards.view(-1, num_generations), dim=1).repeat_interleave(num_generations)
    else:  # "batch"
        std = nanstd(rewards).expand_as(rewards)
    adv = rewards - mean
    return adv / (std + 1e-4) if scale_rewards != "none" else adv


def trl_rloo_advantages(rewards, num_generations, normalize):
    """RLOOTrainer._generate_and_score_completions, leave-one-out baseline, one process."""
    grouped = rewards.view(-1, num_generations)
    counts = (~torch.isnan(grouped)).sum(dim=1, keepdim=True)
    baselines = ((torch.nansum(grouped, dim=1, keepdim=True) - grouped) / (counts - 1)).view(-1)
    adv = rewards - baselines
    return (adv - torch.nanmean(adv)) / (nanstd(adv) + 1e-4) if normalize else adv


def _rewards(seed=0, groups=5, g=4):
    gen = torch.Generator().manual_seed(seed)
    r = torch.randint(0, 3, (groups * g,), generator=gen).to(torch.float64)  # ties and all-equal groups
    r[:g] = 1.0  # one group with zero std
    return r, torch.arange(groups).repeat_interleave(g)


@pytest.mark.parametrize(
    "scale_rewards,fn,kw",
    [
        ("group", group_advantages, {}),
        ("none", group_advantages, {"std_normalize": False}),
        ("batch", lite_ppo_advantages, {}),
    ],
)
def test_advantages_match_trl_scale_rewards(scale_rewards, fn, kw):
    for seed in range(3):
        r, g = _rewards(seed)
        torch.testing.assert_close(fn(r, g, **kw), trl_grpo_advantages(r, 4, scale_rewards), **ADV_TOL)


@pytest.mark.parametrize("normalize", [False, True])
def test_rloo_matches_trl(normalize):
    for seed in range(3):
        r, g = _rewards(seed)
        torch.testing.assert_close(
            rloo_advantages(r, g, std_normalize=normalize), trl_rloo_advantages(r, 4, normalize), **ADV_TOL
        )


def test_difference_reinforce_pp_baseline_is_not_trl_batch_scaling():
    # TRL scale_rewards="batch" (= our lite_ppo) divides by the batch std of the raw rewards;
    # REINFORCE++ w/ baseline divides by the batch std of the group-centred rewards, which excludes the
    # spread between prompts' mean rewards and is smaller here. Same sign and ordering, larger magnitude.
    r, g = _rewards(0)
    trl = trl_grpo_advantages(r, 4, "batch")
    mine = reinforce_pp_baseline_advantages(r, g)
    assert not torch.allclose(trl, mine)
    assert torch.equal(trl.sign(), mine.sign()) and mine.abs().max() > trl.abs().max()
