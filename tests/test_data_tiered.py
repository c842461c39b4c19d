"""The `tiered` benchmark suite: tiers, verifiers, disjoint splits and argument errors."""

import pytest

from schedrl.envs import TaskSource, make_task
from schedrl.envs.tiered import DEFAULT_WEIGHTS, TieredMix


def test_tiered_contract():
    source = make_task("tiered")
    assert isinstance(source, TaskSource)
    train, evals = source.sample("train", 400, 0), source.sample("eval", 200, 0)
    assert not {t.prompt for t in train} & {t.prompt for t in evals}
    assert source.sample("train", 50, 3) == source.sample("train", 50, 3)
    tiers = {t.domain: t.difficulty for t in train}
    assert tiers == {
        "first": 0.0,
        "sort_short": 1.0,
        "reverse_short": 1.0,
        "addition_hard": 2.0,
        "sort_long": 2.0,
    }
    for t in train:
        assert source.reward(t, source.solution(t)) == 1.0
        assert source.reward(t, source.solution(t) + "0") == 0.0
    first = next(t for t in train if t.domain == "first")
    assert first.answer == first.prompt.split(":")[1][0]
    assert min(len(t.answer) for t in train if t.domain == "sort_long") > 8  # beyond an 8-token budget


def test_tiered_weights():
    only = TieredMix(weights={"first": 1.0})
    assert {t.domain for t in only.sample("train", 30, 1)} == {"first"}
    assert set(DEFAULT_WEIGHTS) == {"first", "sort_short", "reverse_short", "addition_hard", "sort_long"}
    with pytest.raises(
        ValueError, match=r"task 'tiered': unknown domain 'nope' in weights; valid domains: first"
    ):
        make_task("tiered", weights={"nope": 1.0})
    with pytest.raises(ValueError, match=r"weights\['first'\] must be a number >= 0, got -1"):
        make_task("tiered", weights={"first": -1})
    with pytest.raises(ValueError, match="positive sum"):
        make_task("tiered", weights={"first": 0})
