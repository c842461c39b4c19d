"""The loss contract: each registered loss's spec matches its function, and the learner drives a new
loss from its spec alone (registering it touches nothing outside `algos/`)."""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass

import pytest
import torch

from schedrl.algos import registry
from schedrl.algos.spec import LossSpec
from schedrl.config import AlgoConfig, OptimConfig
from schedrl.training.batch import collate
from schedrl.training.learner import Learner


@pytest.mark.parametrize("name", list(registry.available("loss")))
def test_spec_names_exactly_the_keywords_the_function_takes(name):
    params = inspect.signature(registry.get("loss", name)).parameters
    keyword_only = {k for k, p in params.items() if p.kind is p.KEYWORD_ONLY}
    required = {k for k in keyword_only if params[k].default is params[k].empty}
    given = registry.loss_spec(name).keywords()
    assert given <= keyword_only, (
        f"{name}: the spec passes {sorted(given - keyword_only)}, which it does not take"
    )
    assert required <= given, f"{name}: it needs {sorted(required - given)}, which its spec does not ask for"


def test_bad_specs_are_refused():
    with pytest.raises(ValueError, match="unknown \\['logits'\\]"):
        LossSpec(frozenset({"logits"}))
    with pytest.raises(ValueError, match="norm must be one of agg, sequence, constant"):
        LossSpec(norm="mean")
    with pytest.raises(ValueError, match="'returns' and token_advantages come together"):
        LossSpec(frozenset({"values", "returns"}))


def test_learner_drives_a_new_loss_from_its_spec(default_model, monkeypatch):
    """A REINFORCE loss that asks for behaviour log-probs, versions and a constant normaliser: the learner
    passes exactly those, and weights its micro-batches as summed (constant), whatever their sizes."""
    monkeypatch.setattr(registry.LOSSES, "_entries", dict(registry.LOSSES._entries))
    seen: list[dict] = []

    def reinforce_sum(logp, old_logp, adv, mask, *, behav_logp, versions, prox_version, max_tokens, clip_eps):
        seen.append(
            {
                "behav": behav_logp.clone(),
                "versions": versions.clone(),
                "prox": prox_version,
                "max_tokens": max_tokens,
                "clip_eps": clip_eps,
                "rows": len(logp),
            }
        )
        loss = -(adv[:, None] * logp * mask).sum() / max_tokens
        return loss, {"seen_tokens": float(mask.sum())}

    @dataclass(frozen=True)
    class Args:
        clip_eps: float = 0.2  # read by the test loss

    spec = LossSpec(frozenset({"behav_logp", "versions"}), "constant", args=Args)
    registry.register("loss", "reinforce_sum", "test: REINFORCE over a constant", spec)(reinforce_sum)
    prompts, completions = [[5, 6, 7], [5, 6], [8, 9, 10, 11]], [[12, 13], [14], [15, 16, 17]]
    behaviour = [[-1.0, -2.0], [-3.0], [-0.5, -0.25, -0.125]]
    versions = [[3, 3], [2], [3, 2, 3]]
    batch = collate(prompts, completions, 0, behaviour, versions)
    adv = torch.tensor([1.0, -1.0, 0.5])

    def train(micro: int) -> dict[str, float]:
        model = copy.deepcopy(default_model)
        learner = Learner(
            model,
            OptimConfig(micro_batch_size=micro, micro_batch_tokens=0, lr=1e-2),
            AlgoConfig(loss="reinforce_sum", loss_args={"clip_eps": 0.3}),
            10,
            max_new_tokens=4,
        )
        return learner.update(batch, adv, step=3, version=3)

    whole = train(micro=8)
    assert len(seen) == 1 and seen[0]["rows"] == 3
    call = seen[0]
    assert call["prox"] == 3 and call["clip_eps"] == 0.3
    assert call["max_tokens"] == 3 * 4  # rows x the generation budget
    mask = batch.mask.bool()
    assert call["behav"][mask].tolist() == [x for row in behaviour for x in row]
    assert call["versions"][mask].tolist() == [v for row in versions for v in row]
    split = train(micro=1)  # one row per micro-batch: the constant normaliser makes the losses add up
    assert len(seen) == 4 and all(c["max_tokens"] == 3 * 4 for c in seen[1:])
    assert split["loss"] == pytest.approx(whole["loss"], rel=1e-6)
    assert split["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-5)
