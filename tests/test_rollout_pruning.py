"""Online pruning keeps each group's configured mix; divided rollout balances groups across workers."""

import pytest
import torch

from schedrl.engine import EngineConfig, HFEngine
from schedrl.rollout import (
    PruneConfig,
    SuccessHead,
    choose_kept,
    divide,
    pruned_rollout,
    training_samples,
    whole_groups,
)
from schedrl.types import Request, SamplingParams


@pytest.mark.parametrize(
    ("finished", "predicted", "keep", "frac", "kept"),
    [
        # all running: 2 most confident successes (0.9, 0.8) + 2 most confident failures (0.05, 0.2)
        ([None] * 6, [0.9, 0.6, 0.8, 0.05, 0.2, 0.4], 4, 0.5, [0, 2, 3, 4]),
        # a finished success counts first; then the most confident running success; 2 failures
        ([1.0, None, None, None, None, None], [None, 0.7, 0.9, 0.1, 0.3, 0.45], 4, 0.5, [0, 2, 3, 4]),
        # success_frac 0.25 of 4 -> 1 success, 3 failures
        ([None] * 6, [0.9, 0.6, 0.8, 0.05, 0.2, 0.4], 4, 0.25, [0, 3, 4, 5]),
        # too few predicted failures: the group is filled with successes
        ([None] * 5, [0.9, 0.6, 0.8, 0.7, 0.2], 4, 0.5, [0, 2, 3, 4]),
        # finished failures are kept before running ones
        ([0.0, None, None, None], [None, 0.1, 0.95, 0.2], 2, 0.5, [0, 2]),
    ],
)
def test_choose_kept_holds_the_configured_mix(finished, predicted, keep, frac, kept):
    assert choose_kept(finished, predicted, keep, frac) == kept


def test_success_head_loss_falls_on_a_separable_signal():
    gen = torch.Generator().manual_seed(0)
    x = torch.cat([torch.ones(400, 1), torch.randn(400, 5, generator=gen)], dim=1)
    y = (x[:, 1] > 0).tolist()
    head = SuccessHead(steps_per_fit=1)
    first = head.fit(list(x), y)
    for _ in range(100):
        last = head.fit([], [])
    assert last < 0.6 * first
    assert ((head.prob(x) > 0.5) == torch.tensor(y)).float().mean() > 0.95


@pytest.mark.parametrize("mode", ["drop", "keep"])
def test_pruned_rollout_keeps_each_group_to_its_size_and_marks_the_rest(model, tokenizer, mode):
    cfg = PruneConfig(keep=3, success_frac=0.5, check_tokens=2, mode=mode)
    prompts = ["12+34=", "sort:31415926=", "rev:0123456789=", "9+9="]
    reqs = [
        Request(
            f"{g}/{i}",
            tuple(tokenizer(p).input_ids),
            SamplingParams(max_new_tokens=16, seed=10 * g + i),
            task_id=str(g),
            group_id=str(g),
            sample_index=i,
        )
        for g, p in enumerate(prompts)
        for i in range(6)
    ]
    engine = HFEngine(model, tokenizer, EngineConfig(max_concurrency=8))
    head = SuccessHead()
    samples = pruned_rollout(engine, reqs, head, lambda s: float(len(s.token_ids) % 2), cfg)
    assert [s.request_id for s in samples] == [r.id for r in reqs]
    assert head.w.abs().sum() > 0  # trained on the members that ran to the end
    for g in range(len(prompts)):
        group = samples[6 * g : 6 * g + 6]
        finished = [s for s in group if s.finish_reason != "pruned"]
        pruned = [s for s in group if s.finish_reason == "pruned"]
        assert len(finished) >= cfg.keep and len(finished) + len(pruned) == 6
        for s in pruned:  # cut after the check point, never before
            assert s.num_tokens >= cfg.check_tokens and s.reward is not None
    assert any(s.finish_reason == "pruned" for s in samples)
    kept = training_samples(samples, mode)
    n_pruned = sum(s.finish_reason == "pruned" for s in samples)
    assert len(kept) == len(samples) - (n_pruned if mode == "drop" else 0)
    with pytest.raises(ValueError, match="unknown mode 'both'; valid: drop, keep"):
        PruneConfig(mode="both")


def test_divided_rollout_spreads_a_long_group_across_workers():
    lengths = {"long": 40.0, "a": 3.0, "b": 3.0, "c": 3.0}
    reqs = [Request(f"{g}/{i}", (1, 2), group_id=g, task_id=g) for g in lengths for i in range(4)]
    predict = lambda r: lengths[r.task_id]  # noqa: E731
    for parts in (divide(reqs, 2, predict, chunk_size=1), whole_groups(reqs, 2)):
        assert sorted(r.id for p in parts for r in p) == sorted(r.id for r in reqs)
    load = lambda parts: max(sum(predict(r) for r in p) for p in parts)  # noqa: E731
    assert load(whole_groups(reqs, 2)) == 160 + 12  # the long group and one short one on the same worker
    assert load(divide(reqs, 2, predict, chunk_size=1)) == 98  # perfectly balanced: (160 + 36) / 2
    assert load(divide(reqs, 2, predict, chunk_size=2)) == 98
    with pytest.raises(ValueError, match="workers must be > 0, got 0"):
        divide(reqs, 0, predict)
