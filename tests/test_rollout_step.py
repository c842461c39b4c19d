"""The synchronous loop's rollout features switched on from the config: speculative reuse and pruning."""

from __future__ import annotations

import copy

import pytest
import torch

from schedrl.api import resolve_config
from schedrl.config import ConfigError, config_from_dict
from schedrl.engine import EngineConfig, HFEngine
from schedrl.orchestrate.run import train
from schedrl.rollout.step import StepRollout
from schedrl.training.run_dir import RunDir, read_metrics
from schedrl.types import Request, SamplingParams

PROMPTS = ["12+34=", "sort:31415926=", "rev:0123456789=", "9+9="]


def _requests(tokenizer, step, params):
    return [
        Request(
            f"s{step}-{i}-{j}",
            tuple(tokenizer(p).input_ids),
            SamplingParams(**{**vars(params), "seed": 7 * step + j}),
            task_id=f"t{i}",
            group_id=f"s{step}-{i}",
            sample_index=j,
        )
        for i, p in enumerate(PROMPTS)
        for j in range(2)
    ]


def _cfg(**args):
    return config_from_dict(
        {"sampling": {"group_size": 4}, "schedule": {"rollout": "speculative", "rollout_args": args}}
    )


def test_speculative_greedy_rollout_equals_plain_greedy_decoding(model, tokenizer):
    """Drafts from the previous step's (different) weights, verified and finished: exactly greedy decoding."""
    policy = copy.deepcopy(model)
    engine = HFEngine(policy, tokenizer, EngineConfig(max_concurrency=8))
    roll = StepRollout(_cfg(), engine, policy, tokenizer)
    greedy = SamplingParams(max_new_tokens=16, temperature=0)
    score = lambda ss: [float(len(s.token_ids)) for s in ss]  # noqa: E731
    first, m0 = roll.run(_requests(tokenizer, 0, greedy), score)
    assert m0["spec_drafts"] == 0
    with torch.no_grad():  # the policy moves: some drafts are now wrong
        for p in policy.parameters():
            p.add_(0.01 * torch.randn_like(p, generator=torch.Generator().manual_seed(0)))
    engine.update_weights(policy.state_dict(), version=1)
    reqs = _requests(tokenizer, 1, greedy)
    before = engine.num_generated
    second, m1 = roll.run(reqs, score)
    ref = HFEngine(policy, tokenizer, EngineConfig(max_concurrency=8)).generate(reqs)
    assert [s.token_ids for s in second] == [s.token_ids for s in ref]
    assert [s.reward for s in second] == [float(len(s.token_ids)) for s in ref]
    assert all(set(s.versions) == {1} for s in second)
    assert m1["spec_drafts"] == len(reqs) and 0 < m1["spec_accepted_tokens"] < m1["spec_draft_tokens"]
    # verification produced the accepted tokens plus one residual token per rejection; the engine the rest
    made_by_verification = m1["spec_accepted_tokens"] + m1["spec_rejected"]
    assert engine.num_generated - before == sum(len(s.token_ids) for s in second) - made_by_verification


def test_drafts_older_than_draft_versions_are_not_used(model, tokenizer):
    policy = copy.deepcopy(model)
    engine = HFEngine(policy, tokenizer, EngineConfig(max_concurrency=8))
    roll = StepRollout(_cfg(draft_versions=1), engine, policy, tokenizer)
    params = SamplingParams(max_new_tokens=16, temperature=1.0)
    score = lambda ss: [0.0] * len(ss)  # noqa: E731
    for step in (0, 1, 3):  # version 1's weights are gone by step 3
        engine.update_weights(policy.state_dict(), version=step)
        _, metrics = roll.run(_requests(tokenizer, step, params), score)
        if step == 1:
            assert metrics["spec_drafts"] == 8 and list(roll.draft_weights) == [0, 1]
    stale = metrics
    assert stale["spec_drafts"] == 0


def test_draft_store_forgets_drafts_too_old_to_use():
    from schedrl.rollout import DraftStore
    from schedrl.types import Sample

    params = SamplingParams(max_new_tokens=4)
    store = DraftStore()
    store.put(
        [
            Sample(
                f"r{v}", (1,), (5, 6), (-1.0, -1.0), (v, v), "stop", params, task_id=f"t{v}", sample_index=0
            )
            for v in range(4)
        ]
    )
    store.drop_before(2)
    assert len(store) == 2
    req = lambda t: Request("x", (1,), params, task_id=t, sample_index=0)  # noqa: E731
    assert store.get(req("t1")) is None and store.get(req("t2")).versions == (2, 2)


def _train(tmp_path, name, steps=3, **over):
    cfg = config_from_dict(
        {
            "task": {"name": "addition"},
            "steps": steps,
            "save_every": 0,
            "out_dir": str(tmp_path),
            "name": name,
            "sft": {"steps": 30, "batch_size": 32, "lr": 1e-3},
            "min_start_reward": 0.0,
            "sampling": {"prompts_per_step": 8, "group_size": 6, "max_new_tokens": 8},
            "eval": {"tasks": 4, "k": 1},
            **over,
        }
    )
    run = RunDir.create(cfg.out_dir, cfg.name)
    train(cfg, run)
    return [r for r in read_metrics(run.metrics_path) if "reward_mean" in r]


@pytest.mark.train
def test_training_with_speculative_reuse_verifies_drafts_of_repeated_tasks(tmp_path):
    # 1-digit addition has few distinct tasks, so later steps see tasks rolled out before
    rows = _train(tmp_path, "spec", steps=4, schedule={"rollout": "speculative"})
    assert rows[0]["spec_drafts"] == 0
    assert sum(r["spec_drafts"] for r in rows[1:]) > 0 and sum(r["spec_accepted_tokens"] for r in rows) > 0
    assert all(0 <= r["spec_acceptance"] <= 1 and torch.isfinite(torch.tensor(r["loss"])) for r in rows)


@pytest.mark.train
@pytest.mark.parametrize("mode", ["drop", "keep"])
def test_training_with_pruning_keeps_the_configured_group_size(tmp_path, mode):
    rows = _train(
        tmp_path,
        f"prune-{mode}",
        steps=2,
        task={"name": "sort", "args": {"min_len": 4, "max_len": 6}},
        schedule={"rollout": "pruning", "rollout_args": {"keep": 3, "mode": mode, "check_tokens": 1}},
    )
    for r in rows:  # judged after every member's first token: 3 of 6 cut in each of the 8 groups
        assert r["pruned_samples"] == 8 * 3
        trained = r["gen_tokens"] / r["completion_len_mean"]  # samples in the batch
        assert round(trained) == (8 * 3 if mode == "drop" else 8 * 6)


PRUNE, SPEC = {"rollout": "pruning"}, {"rollout": "speculative"}


@pytest.mark.parametrize(
    "schedule, pipeline, field",
    [
        ({**PRUNE, "rollout_args": {"keep": 6}}, {}, r"schedule.rollout_args.*'pruning'.*'keep'.*got 6"),
        ({**PRUNE, "rollout_args": {"keep": 1}}, {}, r"schedule.rollout.*'pruning'.*'keep'.*got 1"),
        (
            {**SPEC, "rollout_args": {"keep": 3}},
            {},
            r"schedule.rollout.*'speculative'.*unknown argument 'keep'",
        ),
        (SPEC, {"mode": "async", "backend": "local"}, r"schedule.rollout.*'speculative'.*asynchronous"),
        ({**SPEC, "rollout_args": {"draft_versions": 0}}, {}, r"schedule.rollout.*'draft_versions'.*got 0"),
    ],
)
def test_bad_rollout_settings_name_the_field(schedule, pipeline, field):
    with pytest.raises(ConfigError, match=field):
        resolve_config({"sampling": {"group_size": 6}, "schedule": schedule, "pipeline": pipeline})
