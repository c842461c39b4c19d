"""A task's rule reward mixed with a reward model's score (`task.reward_model`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from schedrl.envs.base import Task, TaskSource
from schedrl.envs.reward_funcs import completion_of, prompt_of
from schedrl.rewards.reward_model import RewardModel

SETTINGS = (
    "path",
    "weight",
    "rule_weight",
    "batch_size",
    "max_length",
    "truncation",
    "template",
    "normalize",
    "device",
)


class ModelRewarded:
    """`source` with its reward replaced by `rule_weight` x its rule reward + `weight` x the reward model's
    score, in one batch call (`reward_batch`, which the reward scorer calls); everything else is the
    source's. A sample whose rule reward raises scores 0 and is counted, as before."""

    def __init__(self, source: TaskSource, spec: Mapping[str, Any]) -> None:
        unknown = sorted(set(spec) - set(SETTINGS))
        if unknown:
            raise ValueError(f"unknown key(s) {', '.join(unknown)}; known: {', '.join(SETTINGS)}")
        if "path" not in spec:
            raise ValueError("missing 'path' (the reward model's directory)")
        settings = {k: v for k, v in spec.items() if k not in ("path", "weight", "rule_weight")}
        self.weight, self.rule_weight = float(spec.get("weight", 1.0)), float(spec.get("rule_weight", 1.0))
        self.model = RewardModel(spec["path"], **settings)
        self.source = source

    @property
    def rule_source(self) -> TaskSource:
        """The task with its own reward: what held-out evaluation scores by (accuracy is the rule's verdict)."""
        return self.source

    def __getattr__(self, name: str) -> Any:
        if name == "source":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.source, name)

    def reward_batch(
        self, tasks: Sequence[Task], completions: Sequence[str], completion_ids: Sequence[Sequence[int]]
    ) -> tuple[list[float], dict[str, float], list[str | None]]:
        base = getattr(self.source, "reward_batch", None)
        metrics: dict[str, float] = {}
        if base is not None:
            rule, metrics, errors = base(tasks, completions, completion_ids)
        else:
            rule, errors = [], []
            for t, c in zip(tasks, completions, strict=True):
                try:
                    rule.append(float(self.source.reward(t, c)))
                    errors.append(None)
                except Exception as err:  # a rule may raise anything: this sample scores 0, counted
                    rule.append(0.0)
                    errors.append(f"task {t.id!r}: {type(err).__name__}: {err}")
        scores = self.model(
            [prompt_of(t) for t in tasks],
            [completion_of(t, c) for t, c in zip(tasks, completions, strict=True)],
        )
        rewards = [
            0.0 if e else self.rule_weight * r + self.weight * s
            for r, s, e in zip(rule, scores, errors, strict=True)
        ]
        n = max(1, len(tasks))
        metrics = {
            **metrics,
            "rewards/rule/mean": sum(rule) / n,
            f"rewards/{self.model.__name__}/mean": sum(scores) / n,
        }
        return rewards, metrics, errors
