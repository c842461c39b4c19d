"""A task's rule reward mixed with a model's reward (`task.reward_model`): a reward model's score or a
generative judge's verdict."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from schedrl.envs.base import Task, TaskSource
from schedrl.envs.reward_funcs import completion_of, prompt_of
from schedrl.rewards.judge import Judge
from schedrl.rewards.reward_model import RewardModel

REWARD_MODEL_SETTINGS = ("batch_size", "max_length", "truncation", "template", "normalize", "device")
JUDGE_SETTINGS = (
    "template",
    "parser",
    "choices",
    "score_range",
    "max_new_tokens",
    "max_parse_failure_rate",
    "min_samples",
    "max_concurrency",
)
MIX = ("weight", "rule_weight")


def build_scorer(spec: Mapping[str, Any], model_key: str) -> RewardModel | Judge:
    """`{model_key: DIR, ...}` a reward model, `{judge: DIR, template: ..., ...}` a generative judge; an
    unknown setting is refused, naming the known ones."""
    if "judge" in spec:
        key, known, cls = "judge", JUDGE_SETTINGS, Judge
    elif model_key in spec:
        key, known, cls = model_key, REWARD_MODEL_SETTINGS, RewardModel
    else:
        raise ValueError(
            f"missing {model_key!r} (a reward model's directory) or 'judge' (a causal LM's directory)"
        )
    settings = {k: v for k, v in spec.items() if k != key}
    unknown = sorted(set(settings) - set(known))
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)}; known: {', '.join((key, *known))}")
    return cls(spec[key], **settings)


class ModelRewarded:
    """`source` with its reward replaced by `rule_weight` x its rule reward + `weight` x the model's
    reward, in one batch call (`reward_batch`, which the reward scorer calls); everything else is the
    source's. A sample whose rule reward raises scores 0 and is counted, as before."""

    def __init__(self, source: TaskSource, spec: Mapping[str, Any]) -> None:
        try:
            self.model = build_scorer({k: v for k, v in spec.items() if k not in MIX}, "path")
        except ValueError as err:
            if "unknown key" not in str(err):
                raise
            raise ValueError(f"{err}, {', '.join(MIX)}") from None
        self.weight, self.rule_weight = float(spec.get("weight", 1.0)), float(spec.get("rule_weight", 1.0))
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
            answer=[t.answer for t in tasks],
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
            **(self.model.metrics() if isinstance(self.model, Judge) else {}),
        }
        return rewards, metrics, errors
