"""Weight pushes that check themselves: a push travels in buckets (a decoder layer each) with a checksum
each and a probe; an engine that loaded other weights than were sent, missed a bucket, or does not
reproduce the learner's log-probs of the probe fails the push, naming the version and the bucket."""

from __future__ import annotations

import copy

import pytest
import torch

import schedrl
from schedrl.config import config_from_dict
from schedrl.distributed import EngineWorker
from schedrl.distributed.workers import LearnerWorker, cpu_weights
from schedrl.engine import weight_push
from schedrl.engine.weight_push import (
    WeightPush,
    WeightPushError,
    bucket_of,
    bucketed,
    checksums,
)


def test_buckets_are_decoder_layers_and_the_rest():
    assert bucket_of("model.layers.3.self_attn.q_proj.weight") == "layers.3"
    assert bucket_of("model.layers.12.mlp.down_proj.weight") == "layers.12"
    assert bucket_of("model.embed_tokens.weight") == bucket_of("lm_head.weight") == "rest"


def test_bucketed_gathers_one_bucket_at_a_time():
    fetched: list[str] = []

    def get(name):
        fetched.append(name)
        return torch.full((2,), float(len(fetched)))

    names = [
        "model.embed_tokens.weight",
        "model.layers.0.a",
        "model.layers.0.b",
        "model.layers.1.a",
        "model.norm.weight",
    ]
    buckets = bucketed((n, lambda n=n: get(n)) for n in names)
    assert [b.name for b in buckets] == ["rest", "layers.0", "layers.1"]
    # a bucket's weights are fetched together, in the order the buckets first appear
    assert fetched == [
        "model.embed_tokens.weight",
        "model.norm.weight",
        "model.layers.0.a",
        "model.layers.0.b",
        "model.layers.1.a",
    ]
    assert buckets[1].sum == checksums(buckets[1].weights)["layers.0"]


def _versions(default_model):
    """Two policy versions' weights (tied weights stay tied: perturbed as parameters)."""
    old = cpu_weights(default_model)
    model = copy.deepcopy(default_model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    return old, cpu_weights(model), model


def push_of(model, version):
    return weight_push.push_of(model, version, tol=1e-4)


def test_the_engine_reads_back_what_it_loaded(default_model):
    cfg = config_from_dict({})
    old, _, new_model = _versions(default_model)
    engine = EngineWorker(cfg, old, 0)
    engine.update_weights(push_of(new_model, 1), 1)  # a good push passes, probe included
    assert engine.engine.version == 1
    # the engine keeps its linear weights input-major: the checksum reads values, not the layout
    assert not engine.engine.model.model.layers[0].self_attn.q_proj.weight.is_contiguous()
    stale = push_of(new_model, 2)
    for name in stale.buckets[1].weights:
        stale.buckets[1].weights[name] = old[name]  # one bucket arrives stale: its checksum is the new one
    with pytest.raises(
        WeightPushError, match=r"engine: weight push of version 2: bucket 'layers.0' holds other"
    ):
        engine.update_weights(stale, 2)
    with pytest.raises(WeightPushError, match=r"announced as version 3 carries version 2's weights"):
        engine.update_weights(push_of(new_model, 2), 3)
    partial = push_of(new_model, 4)
    del partial.buckets[0]  # the `rest` bucket never arrives
    with pytest.raises(WeightPushError, match=r"version 4: bucket 'rest' never arrived \(1 of 3 missing\)"):
        engine.update_weights(partial, 4)


def test_the_probe_catches_weights_the_engine_does_not_generate_from(default_model):
    """A push whose checksums all pass but whose probe the engine cannot reproduce (here: the learner's
    probe came from other weights) fails, naming the version and the worst token."""
    cfg = config_from_dict({})
    old, _, new_model = _versions(default_model)
    engine = EngineWorker(cfg, old, 0)
    push = push_of(new_model, 1)
    push.probe = push_of(default_model, 1).probe  # log-probs of version 0
    with pytest.raises(
        WeightPushError, match=r"version 1: the engine's log-probs of the probe differ .* tolerance 0.0001"
    ):
        engine.update_weights(push, 1)
    # the same push with its own probe passes within 1e-4: the engine's kernels equal the learner's to float rounding
    engine.update_weights(push_of(new_model, 2), 2)


def test_checksums_change_with_any_weight(default_model):
    w = cpu_weights(default_model)
    before = checksums(w)
    w2 = copy.deepcopy(w)
    name = "model.layers.0.mlp.up_proj.weight"
    w2[name][3, 5] += 1e-7
    after = checksums(w2)
    assert [b for b in before if before[b] != after[b]] == ["layers.0"]


@pytest.mark.train
def test_a_wrong_push_stops_the_run_in_the_step_it_happens(tmp_path, monkeypatch):
    real = LearnerWorker.update

    def update(self, batch, step):
        stats, push = real(self, batch, step)
        assert isinstance(push, WeightPush) and push.probe is not None
        if step == 2:  # the third update's push: one layer left at other weights, checksums unchanged
            layer = next(b for b in push.buckets if b.name == "layers.0")
            for name in layer.weights:
                layer.weights[name] = layer.weights[name] - 1.0
        return stats, push

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
