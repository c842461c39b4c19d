"""AgentRL's cross-policy sampling: a seeded share of an episode's model turns sampled by another policy's
engine, their tokens context (never trained) and exactly what that engine sampled; the run's settings."""

from __future__ import annotations

import pytest

from schedrl.config import ConfigError, config_from_dict
from schedrl.engine import HFEngine
from schedrl.envs.base import Task
from schedrl.envs.environment import Observation, StepResult
from schedrl.rollout.episodes import EpisodeRunner
from schedrl.types import Request, SamplingParams

ROUNDS = 5


class Rounds:
    stop_strings = ()

    def __init__(self) -> None:
        self.turns = 0

    async def reset(self, task, seed: int) -> Observation:
        return Observation(task.prompt, "template")

    async def step(self, action: str) -> StepResult:
        self.turns += 1
        if self.turns == ROUNDS:
            return StepResult(None, 1.0, done=True)
        return StepResult(Observation("ab", "env"), 0.5, done=False)


class Recording(HFEngine):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.finished: dict[str, tuple[int, ...]] = {}

    def step(self):
        out = super().step()
        self.finished.update({s.request_id: s.token_ids for s in out})
        return out


def _run(model, other_model, tokenizer, p: float, n: int = 4, budget: int = 60, alone: bool = False):
    task = Task("t0", "go:", "", domain="test")
    mine, other = Recording(model, tokenizer), Recording(other_model, tokenizer)
    runner = EpisodeRunner(mine, tokenizer, Rounds, max_turns=ROUNDS, max_turn_tokens=3, cross=(other, p))
    requests = [
        Request(f"e{i}", tuple(tokenizer("go:").input_ids), SamplingParams(budget, seed=i), task_id="t0",
                group_id="g", sample_index=i)
        for i in range(n)
    ]  # fmt: skip
    try:
        return runner.run(requests, {"t0": task}, alone=alone), mine, other, runner
    finally:
        runner.close()


def test_the_other_policy_s_turns_are_its_own_tokens_and_never_trained(model, other_model, tokenizer):
    samples, mine, other, runner = _run(model, other_model, tokenizer, p=0.5)
    assert other.finished and mine.finished  # both policies sampled turns
    assert runner.other_turns == len(other.finished)
    for i, s in enumerate(samples):
        assert s.trained is not None
        full, at = s.prompt_ids + s.token_ids, 0
        for t in range(ROUNDS):  # each turn's tokens, exactly as its engine sampled them, in order
            rid = f"e{i}/turn{t}"
            assert not (rid in mine.finished and rid in other.finished)
            turn = other.finished.get(rid) or mine.finished[rid]
            at = next(j for j in range(at, len(full)) if full[j : j + len(turn)] == turn) + len(turn)
        # only the policy's own tokens are trained (the other policy's are context, even at the start)
        own = sum(len(v) for k, v in mine.finished.items() if k.startswith(f"e{i}/"))
        assert sum(s.trained) == own
        assert s.reward == pytest.approx(0.5 * (ROUNDS - 1) + 1.0)
        assert (
            s.turn_rewards is not None and len(s.turn_rewards) == ROUNDS
        )  # one per turn, whoever sampled it
    # the draw is seeded: the same turns go to the other policy again
    _, _, again, _ = _run(model, other_model, tokenizer, p=0.5)
    assert set(again.finished) == set(other.finished)


def test_every_turn_to_the_other_policy_trains_nothing_and_counts_against_the_budget(
    model, other_model, tokenizer
):
    samples, mine, other, _ = _run(model, other_model, tokenizer, p=1.0, n=2, budget=6)
    assert not mine.finished and all(s.trained is not None and not any(s.trained) for s in samples)
    assert all(
        sum(len(v) for k, v in other.finished.items() if k.startswith(f"e{i}/")) <= 6 for i in range(2)
    )


def test_episodes_run_alone_give_every_turn_to_the_policy(model, other_model, tokenizer):
    """A held-out evaluation judges the policy: its episodes run `alone`, with no other-policy turn."""
    samples, mine, other, runner = _run(model, other_model, tokenizer, p=0.5, alone=True)
    assert not other.finished and runner.other_turns == 0
    assert len(mine.finished) == 4 * ROUNDS
    assert all(s.trained is not None and all(s.trained[len(s.trained) - 1 :]) for s in samples)


def test_the_held_out_evaluation_never_crosses(model, other_model, tokenizer):
    from schedrl.orchestrate.evaluate import evaluate

    class Source:
        def sample(self, split, n, seed):
            return [Task(f"t{i}", "go:", "", domain="test") for i in range(n)]

    mine, other = Recording(model, tokenizer), Recording(other_model, tokenizer)
    runner = EpisodeRunner(mine, tokenizer, Rounds, max_turns=ROUNDS, max_turn_tokens=3, cross=(other, 0.9))
    try:
        out = evaluate(mine, tokenizer, Source(), n_tasks=3, k=2, temperature=1.0, max_new_tokens=60, seed=0,
                       episodes=runner)  # fmt: skip
    finally:
        runner.close()
    assert out["greedy_acc"] == 1.0 and not other.finished and runner.other_turns == 0
    assert len(mine.finished) == 3 * (1 + 2) * ROUNDS  # greedy and k = 2 sampled episodes, every turn its own


def test_bad_cross_policy_settings_are_named(tmp_path):
    base = {"name": "guess", "env": "guess"}
    with pytest.raises(ConfigError, match=r"'task.cross_policy.p' must be in \(0, 1\), got 1"):
        config_from_dict({"task": {**base, "cross_policy": {"model": "m", "p": 1}}})
    with pytest.raises(ConfigError, match="task.cross_policy has no field 'share'"):
        config_from_dict({"task": {**base, "cross_policy": {"model": "m", "p": 0.5, "share": 1}}})
    with pytest.raises(ConfigError, match="'task.cross_policy' needs a multi-turn task.env"):
        config_from_dict({"task": {"name": "addition", "cross_policy": {"model": "m", "p": 0.5}}})
    from schedrl.orchestrate.build import other_policy_engine

    cfg = config_from_dict({"task": {**base, "cross_policy": {"model": str(tmp_path / "none"), "p": 0.5}}})
    with pytest.raises(ConfigError, match="is not a model directory"):
        other_policy_engine(cfg, str(tmp_path / "none"), None)


@pytest.mark.train
def test_a_run_samples_across_policies(tmp_path, tokenizer, other_model):
    import schedrl
    from schedrl.training.run_dir import read_metrics

    other_model.save_pretrained(tmp_path / "other")
    tokenizer.save_pretrained(tmp_path / "other")
    cfg = {
        "steps": 2, "save_every": 0, "out_dir": str(tmp_path), "name": "cross", "sft": {"steps": 5},
        "eval": {"tasks": 0}, "min_start_reward": -1.0, "logging": {"backends": ["jsonl"]},
        "task": {"name": "guess", "env": "guess", "max_turns": 4,
                 "cross_policy": {"model": str(tmp_path / "other"), "p": 0.5}},
        "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 16},
    }  # fmt: skip
    schedrl.train(cfg)
    rows = [r for r in read_metrics(tmp_path / "cross" / "metrics.jsonl") if "loss" in r]
    assert len(rows) == 2 and rows[-1]["cross/other_turns"] > 0 and rows[-1]["masked_tokens"] > 0


def test_an_episode_with_no_turn_of_its_own_leaves_no_row():
    from schedrl.types import Sample

    empty = Sample("e0", (1, 2, 3), (), (), (), "stop", SamplingParams(4), reward=1.0)
    assert empty.rows() == []
