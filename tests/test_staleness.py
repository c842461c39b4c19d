"""The staleness bound: admission arithmetic, per-token masks, the histogram, and the auto rule."""

from __future__ import annotations

import pytest

from schedrl.orchestrate.staleness import (
    AutoStaleness,
    StalenessBound,
    expected_update,
    may_admit,
    token_staleness,
)


def test_admission_arithmetic():
    # 4 groups per step, update 3 running (started=3 after launching it), 5 groups ahead:
    assert expected_update(3, 5, 4) == 4
    assert may_admit(3, 5, 4, engine_version=3, k=1)
    assert not may_admit(3, 5, 4, engine_version=3, k=0)
    assert not may_admit(3, 8, 4, engine_version=3, k=1)  # would be consumed by update 5
    assert may_admit(0, 3, 4, engine_version=0, k=0) and not may_admit(0, 4, 4, engine_version=0, k=0)


def test_fresh_mask_and_histogram():
    b = StalenessBound(k=1)
    assert token_staleness(5, [5, 4, 3]) == [0, 1, 2]
    assert b.fresh_mask(5, [5, 4, 3]) == [True, True, False]
    b.record(5, [[5, 4, 3]], [[True, True, False]])
    b.record(6, [[6, 6]], [[True, True]])
    assert dict(b.histogram) == {0: 3, 1: 1}
    other = StalenessBound()
    other.load_state_dict(b.state_dict())
    assert other.k == 1 and other.histogram == b.histogram
    with pytest.raises(ValueError, match="max_staleness"):
        StalenessBound(k=-1)


def test_auto_rule_by_hand():
    a = AutoStaleness(k=0, k_min=0, k_max=2, low=0.01, high=0.1, ema=0.5, patience=2)
    ks = [a.observe(m) for m in [0.0, 0.0, 0.0, 0.0, 0.0, 0.3, 0.0, 0.0]]
    # ema: 0, 0 (k 0->1 after 2 quiet updates), 0, 0 (->2), 0, 0.15 (> high: ->1), 0.075, 0.0375
    assert ks == [0, 1, 1, 2, 2, 1, 1, 1]
    assert a.mismatch == pytest.approx(0.0375)
    b = AutoStaleness(k_min=0, k_max=2, low=0.01, high=0.1)
    b.load_state_dict(a.state_dict())
    assert (b.k, b.mismatch, b.since_change) == (a.k, a.mismatch, a.since_change)
    assert b.observe(0.0) == a.observe(0.0)


def test_auto_stays_within_bounds():
    a = AutoStaleness(k=5, k_min=1, k_max=3, low=0.01, high=0.1)
    assert a.k == 3
    for _ in range(10):
        a.observe(1.0)
    assert a.k == 1
    for _ in range(20):
        a.observe(0.0)
    assert a.k == 3
    with pytest.raises(ValueError, match="k_min"):
        AutoStaleness(k_min=3, k_max=1)
    with pytest.raises(ValueError, match="low"):
        AutoStaleness(low=0.2, high=0.1)


def test_context_tokens_are_not_judged_by_staleness():
    bound = StalenessBound(1)
    versions, trained = [5, -1, -1, 4, 3], [True, False, False, True, True]
    # the tool's tokens (version -1) neither drop the sample nor enter the loss
    assert bound.trainable(5, versions[:4], "drop", trained[:4]) == [True, False, False, True]
    assert bound.trainable(5, versions, "drop", trained) is None  # version 3 is 2 > k old
    assert bound.trainable(5, versions, "mask", trained) == [True, False, False, True, False]
    # keep: k bounds admission only; every model token trains, however old (APRIL's resumed samples)
    assert bound.trainable(5, versions, "keep", trained) == trained
    assert bound.trainable(9, [0, 1], "keep") == [True, True]
    assert bound.trainable(5, [5, 4], "drop") == [True, True]
