"""The learner with an off-policy correction: pi_prox recomputed, behaviour log-probs from the batch,
importance-ratio stats and the behaviour-vs-proximal KL logged."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from test_learner import make_batch
from test_learner_algos import one_thread

from schedrl.config import AlgoConfig, ConfigError, OptimConfig, config_from_dict
from schedrl.training.batch import collate
from schedrl.training.learner import Learner


@pytest.fixture(autouse=True)
def _one_thread():
    yield from one_thread()


def _vec(model):
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach()


def _learner(model, algo, optim=None):
    return Learner(copy.deepcopy(model), optim or OptimConfig(), algo, total_steps=10)


def _with_behaviour(learner, batch, shift=0.0):
    """The batch with pi_behav = pi_prox * exp(-shift) on every completion token."""
    batch.behaviour_logp = (learner.logprobs(learner.model, batch) - shift) * batch.mask
    return batch


@pytest.mark.parametrize("correction", ["decoupled", "tis"])
def test_behaviour_equal_to_proximal_trains_like_no_correction(default_model, correction):
    batch, adv = make_batch()
    plain = _learner(default_model, AlgoConfig())
    plain.update(batch, adv, 0)
    fixed = _learner(default_model, AlgoConfig(correction=correction))
    stats = fixed.update(_with_behaviour(fixed, batch), adv, 0)
    torch.testing.assert_close(_vec(fixed.model), _vec(plain.model), atol=1e-6, rtol=0)
    assert not torch.allclose(_vec(fixed.model), _vec(default_model))
    assert stats["is_ratio_mean"] == pytest.approx(1.0) and stats["is_capped_frac"] == 0.0
    assert abs(stats["behaviour_kl"]) < 1e-9


def test_stats_measure_the_gap_between_behaviour_and_proximal(default_model):
    batch, adv = make_batch()
    learner = _learner(default_model, AlgoConfig(correction="decoupled", is_cap=1.5))
    stats = learner.update(_with_behaviour(learner, batch, shift=math.log(2)), adv, 0)  # rho = 2 everywhere
    assert stats["is_ratio_mean"] == pytest.approx(2.0, rel=1e-5)
    assert stats["is_ratio_max"] == pytest.approx(2.0, rel=1e-5)
    assert stats["is_capped_frac"] == 1.0
    assert stats["behaviour_kl"] == pytest.approx(1 - math.log(2), rel=1e-4)  # k3 = rho - 1 - ln rho
    assert stats["is_weight_mean"] == pytest.approx(1.5, rel=1e-5)  # every weight capped at C


def test_a_capped_weight_changes_the_update(default_model):
    batch, adv = make_batch()
    runs = []
    for cap in (1.0, 4.0):
        learner = _learner(default_model, AlgoConfig(correction="decoupled", is_cap=cap))
        learner.update(_with_behaviour(learner, batch, shift=math.log(3)), adv, 0)
        runs.append(_vec(learner.model))
    assert not torch.allclose(runs[0], runs[1])


def test_cross_stage_reads_per_token_versions(default_model):
    batch, adv = make_batch()
    learner = _learner(default_model, AlgoConfig(correction="cross_stage"))
    with pytest.raises(ValueError, match="algo.correction='cross_stage' needs per-token policy versions"):
        learner.update(batch, adv, 5)
    batch = _with_behaviour(learner, batch, shift=math.log(2))
    # every completion token from version 4 except the first target column's: version 5 = pi_prox
    batch.versions = torch.where(batch.mask.bool(), 4, -1)
    batch.versions[:, 0] = torch.where(batch.mask[:, 0].bool(), 5, -1)
    stale = float((batch.versions == 4).sum() / batch.mask.sum())
    stats = learner.update(batch, adv, 5)
    assert stats["stale_token_frac"] == pytest.approx(stale)
    with pytest.raises(ValueError, match="version 4 > the proximal policy's 3"):
        learner.update(batch, adv, 6, version=3)


def test_collate_keeps_versions_only_when_given():
    b = collate([[5, 6], [7]], [[8, 9, 10], [11]], pad_id=0, versions=[[0, 1, 1], [2]])
    assert b.versions.tolist() == [[-1, 0, 1, 1], [2, -1, -1, -1]]
    assert b.select(torch.tensor([1])).versions.tolist() == [[2]]
    assert collate([[5]], [[6]], pad_id=0).versions is None
    with pytest.raises(ValueError, match="versions 0 has 1 entries for 2 tokens"):
        collate([[5]], [[6, 7]], pad_id=0, versions=[[0]])


def test_correction_config_errors(default_model):
    with pytest.raises(ConfigError, match="config field 'algo.is_cap' must be >= 1, got 0.5"):
        AlgoConfig(is_cap=0.5)
    with pytest.raises(
        ConfigError, match="config field 'algo.correction' must be one of .*'tis'.*got 'bogus'"
    ):
        config_from_dict({"algo": {"correction": "bogus"}})
    assert config_from_dict({"algo": {"correction": "tis", "is_cap": 3}}).algo.is_cap == 3.0
    assert config_from_dict([], ["algo.is_cap=.inf"]).algo.is_cap == math.inf  # no cap
    with pytest.raises(ValueError, match=r"algo.correction='decoupled' .* got algo.loss='gspo'"):
        _learner(default_model, AlgoConfig(loss="gspo", correction="decoupled"))
