import copy

import pytest
import torch

from schedrl.config import AlgoConfig, OptimConfig
from schedrl.training.batch import TokenBatch, collate
from schedrl.training.learner import Learner, NonFiniteLossError


def make_batch(n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [
        torch.randint(4, 90, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n)
    ]
    completions = [
        torch.randint(4, 90, (int(torch.randint(1, 5, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n)
    ]
    adv = torch.randn(n, generator=g)
    return collate(prompts, completions, pad_id=0), adv


def params_after(model, optim, algo=None, steps=1, adv_scale=1.0):
    model = copy.deepcopy(model)
    learner = Learner(model, optim, algo or AlgoConfig(), total_steps=10)
    batch, adv = make_batch()
    stats = [learner.update(batch, adv * adv_scale, step) for step in range(steps)]
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach(), learner, stats


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean"])
def test_gradient_accumulation_matches_one_big_batch(default_model, agg):
    algo = AlgoConfig(loss_agg=agg)
    big, _, _ = params_after(default_model, OptimConfig(micro_batch_size=64, micro_batch_tokens=0), algo)
    small, _, _ = params_after(default_model, OptimConfig(micro_batch_size=3), algo)
    tokens, _, _ = params_after(default_model, OptimConfig(micro_batch_size=64, micro_batch_tokens=40), algo)
    before = torch.nn.utils.parameters_to_vector(default_model.parameters()).detach()
    assert not torch.allclose(big, before)
    # the same sum in another order: float re-association only
    torch.testing.assert_close(small, big, atol=5e-6, rtol=0)
    torch.testing.assert_close(tokens, big, atol=5e-6, rtol=0)


@pytest.mark.parametrize("padding_free", [False, True])
def test_micro_batches_sort_by_length_and_cap_tokens(default_model, padding_free):
    cfg = OptimConfig(micro_batch_size=3, micro_batch_tokens=20, padding_free=padding_free)
    learner = Learner(copy.deepcopy(default_model), cfg, AlgoConfig(), total_steps=1)
    lengths = [4, 9, 2, 7, 7, 3, 1, 5]
    attn = torch.zeros(len(lengths), 9, dtype=torch.long)
    for i, n in enumerate(lengths):
        attn[i, :n] = 1
    batch = TokenBatch(attn, attn, attn[:, 1:], attn[:, 1:].float(), attn[:, 1:].float())
    chunks = [c.tolist() for c in learner._chunks(torch.arange(len(lengths)), batch)]
    if padding_free:  # longest first; a chunk grows while its real tokens <= 20 and rows <= 3
        assert chunks == [[1, 3], [4, 7, 0], [5, 2, 6]]
    else:  # ... while rows x its first row's length (the padded size) <= 20
        assert chunks == [[1, 3], [4, 7], [0, 5, 2], [6]]


def test_epochs_and_minibatches_count_optimizer_steps(default_model):
    _, learner, stats = params_after(default_model, OptimConfig(ppo_epochs=2, minibatches=2))
    state = learner.optimizer.state_dict()["state"]
    assert all(int(s["step"]) == 4 for s in state.values())
    assert stats[0]["clipfrac"] >= 0 and "approx_kl" in stats[0]


def test_lr_schedule_steps_once_per_training_step(default_model):
    _, learner, stats = params_after(
        default_model, OptimConfig(lr=1e-3, schedule="warmup", warmup_steps=4), steps=3
    )
    assert [round(s["lr"], 6) for s in stats] == [0.0005, 0.00075, 0.001]  # lr(t + 1) after step t


def test_non_finite_loss_is_skipped_then_stops(default_model):
    model = copy.deepcopy(default_model)
    learner = Learner(model, OptimConfig(max_bad_steps=2), AlgoConfig(), total_steps=10)
    batch, adv = make_batch()
    before = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    bad = adv.clone()
    bad[0] = float("nan")
    stats = learner.update(batch, bad, 0)
    assert stats["skipped_steps"] == 1
    torch.testing.assert_close(torch.nn.utils.parameters_to_vector(model.parameters()), before)
    learner.update(batch, adv, 1)  # a good step resets the run of bad ones
    assert learner.bad_in_a_row == 0
    learner.update(batch, bad, 2)
    with pytest.raises(NonFiniteLossError, match="2 optimizer steps in a row"):
        learner.update(batch, bad, 3)


def test_kl_to_an_identical_reference_is_zero(default_model):
    model = copy.deepcopy(default_model)
    learner = Learner(
        model,
        OptimConfig(),
        AlgoConfig(kl_coef=0.1, kl_estimator="k3"),
        10,
        ref_model=copy.deepcopy(default_model),
    )
    batch, adv = make_batch()
    stats = learner.update(batch, adv, 0)
    assert abs(stats["kl"]) < 1e-6
    stats = learner.update(batch, adv, 1)
    assert stats["kl"] > 0  # the policy moved away from the frozen reference


@pytest.mark.parametrize("name", ["grpo", "dapo", "gspo", "cispo"])
def test_registered_losses_train_through_the_learner(default_model, name):
    after, _, stats = params_after(default_model, OptimConfig(), AlgoConfig(loss=name))
    before = torch.nn.utils.parameters_to_vector(default_model.parameters()).detach()
    assert torch.isfinite(torch.tensor(stats[0]["loss"])) and not torch.allclose(after, before)


def test_a_loss_the_learner_cannot_drive_is_a_clear_error(default_model):
    with pytest.raises(
        ValueError,
        match=r"algo.loss='drgrpo': .* does not take agg, so algo.loss_agg='seq_mean' cannot apply; "
        r"pick one of: cispo, dapo, grpo, gspo",
    ):
        Learner(
            copy.deepcopy(default_model), OptimConfig(), AlgoConfig(loss="drgrpo", loss_agg="seq_mean"), 10
        )
    with pytest.raises(ValueError, match=r"algo.loss='ppo_clip': .* takes no ref_logp, so algo.kl_coef=0.1"):
        Learner(copy.deepcopy(default_model), OptimConfig(), AlgoConfig(loss="ppo_clip", kl_coef=0.1), 10)
    with pytest.raises(ValueError, match="unknown loss 'nope'"):
        Learner(copy.deepcopy(default_model), OptimConfig(), AlgoConfig(loss="nope"), 10)


def test_adamw_is_fused_on_cpu_and_steps_as_the_per_tensor_loop():
    from schedrl.training.optimizer import adamw

    torch.manual_seed(0)
    a = torch.nn.Linear(5, 3)
    b = torch.nn.Linear(5, 3)
    b.load_state_dict(a.state_dict())
    start = a.weight.detach().clone()
    fast = adamw(a.parameters(), lr=0.1, weight_decay=0.01)
    slow = torch.optim.AdamW(b.parameters(), lr=0.1, weight_decay=0.01, foreach=False)
    assert fast.defaults["fused"] is True and not slow.defaults["fused"]
    for _ in range(3):
        x = torch.randn(4, 5)
        for m, opt in ((a, fast), (b, slow)):
            opt.zero_grad()
            m(x).pow(2).sum().backward()
            opt.step()
    assert (a.weight - start).abs().min() > 0.01  # three steps of lr 0.1 moved every weight
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def _count_mlp_calls(model):
    calls, mlp = [0], model.model.layers[0].mlp
    forward = mlp.forward

    def counted(*args, **kwargs):
        calls[0] += 1
        return forward(*args, **kwargs)

    mlp.forward = counted
    return calls


@pytest.mark.parametrize("padding_free", [False, True])
def test_gradient_checkpointing_recomputes_to_the_same_step(default_model, padding_free):
    runs = {}
    for on in (False, True):
        model = copy.deepcopy(default_model)
        calls = _count_mlp_calls(model)
        learner = Learner(
            model, OptimConfig(padding_free=padding_free, gradient_checkpointing=on), AlgoConfig(), 10
        )
        batch, adv = make_batch()
        stats = [learner.update(batch, adv, step) for step in range(2)]
        runs[on] = (torch.nn.utils.parameters_to_vector(model.parameters()).detach(), stats, calls[0])
    # the backward pass runs each layer's forward again, and the step is the same
    assert runs[True][2] > runs[False][2]
    torch.testing.assert_close(runs[True][0], runs[False][0], atol=1e-6, rtol=0)
    assert [s["loss"] for s in runs[True][1]] == pytest.approx([s["loss"] for s in runs[False][1]], abs=1e-6)
