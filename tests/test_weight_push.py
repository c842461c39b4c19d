"""Weight pushes that check themselves: a push carries its version and a checksum per bucket; an engine
that loaded other weights than were sent fails the push, naming the version and the bucket."""

from __future__ import annotations

import copy

import pytest
import torch

import schedrl
from schedrl.config import config_from_dict
from schedrl.distributed import EngineWorker
from schedrl.distributed.weight_push import PushedWeights, WeightPushError, bucket_of, checksums, verify
from schedrl.distributed.workers import LearnerWorker, cpu_weights


def test_buckets_are_decoder_layers_and_the_rest():
    assert bucket_of("model.layers.3.self_attn.q_proj.weight") == "layers.3"
    assert bucket_of("model.layers.12.mlp.down_proj.weight") == "layers.12"
    assert bucket_of("model.embed_tokens.weight") == bucket_of("lm_head.weight") == "rest"


def _versions(default_model):
    """Two policy versions' weights (tied weights stay tied: perturbed as parameters)."""
    old = cpu_weights(default_model)
    model = copy.deepcopy(default_model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    return old, cpu_weights(model)


def test_the_engine_reads_back_what_it_loaded(default_model):
    cfg = config_from_dict({})
    old, new = _versions(default_model)
    engine = EngineWorker(cfg, old, 0)
    engine.update_weights(PushedWeights.of(new, 1), 1)  # a good push passes
    # the engine keeps its linear weights input-major: the checksum reads values, not the layout
    assert not engine.engine.model.model.layers[0].self_attn.q_proj.weight.is_contiguous()
    stale = PushedWeights.of(new, 2)
    for name in [n for n in new if bucket_of(n) == "layers.1"]:
        dict.__setitem__(stale, name, old[name])  # one bucket arrives stale: the checksums are the new ones
    with pytest.raises(
        WeightPushError, match=r"engine: weight push of version 2: bucket 'layers.1' holds other"
    ):
        engine.update_weights(stale, 2)
    with pytest.raises(WeightPushError, match=r"announced as version 3 carries version 2's weights"):
        engine.update_weights(PushedWeights.of(new, 2), 3)
    partial = PushedWeights.of(new, 4)
    for name in [n for n in new if bucket_of(n) == "rest"]:
        del partial[name]  # a bucket that never arrived: the engine still holds the old one
    with pytest.raises(WeightPushError, match=r"version 4: bucket 'rest'"):
        engine.update_weights(partial, 4)


def test_checksums_change_with_any_weight(default_model):
    w = cpu_weights(default_model)
    before = checksums(w)
    w2 = copy.deepcopy(w)
    name = "model.layers.0.mlp.up_proj.weight"
    w2[name][3, 5] += 1e-7
    after = checksums(w2)
    assert [b for b in before if before[b] != after[b]] == ["layers.0"]
    verify(w, PushedWeights.of(w, 7), 7)


def test_a_wrong_push_stops_the_run_in_the_step_it_happens(tmp_path, monkeypatch):
    real = LearnerWorker.update

    def update(self, batch, step):
        stats, weights = real(self, batch, step)
        assert isinstance(weights, PushedWeights)
        if step == 2:  # the third update's weights: one layer left at the last version's
            for name in [n for n in weights if bucket_of(n) == "layers.0"]:
                dict.__setitem__(weights, name, weights[name] - 1.0)
        return stats, weights

    monkeypatch.setattr(LearnerWorker, "update", update)
    cfg = {
        "steps": 5, "save_every": 0, "out_dir": str(tmp_path), "name": "bad",
        "sft": {"steps": 5}, "eval": {"tasks": 0}, "min_start_reward": 0.0,
        "pipeline": {"mode": "async", "backend": "local"}, "logging": {"backends": ["jsonl"]},
    }  # fmt: skip
    with pytest.raises(WeightPushError, match=r"version 3: bucket 'layers.0'"):
        schedrl.train(cfg)
    rows = [
        line for line in (tmp_path / "bad" / "metrics.jsonl").read_text().splitlines() if '"loss"' in line
    ]
    # the third update finished (and was logged); its push failed before any sample came from it
    assert len(rows) == 3
