"""One update's batch in the asynchronous pipeline: its groups' samples, trained-token masks,
group advantages, the payload the learner worker receives, and the batch's metrics."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from schedrl.algos import registry
from schedrl.algos.advantages import task_normalized
from schedrl.algos.turn_credit import per_token, turn_advantages
from schedrl.config import AlgoConfig
from schedrl.contracts.workers import LearnerBatch
from schedrl.orchestrate.buffer import Group
from schedrl.orchestrate.staleness import StalenessBound
from schedrl.orchestrate.step_metrics import rollout_metrics, scheduler_metrics
from schedrl.rollout import group_index
from schedrl.training.batch import target_rows
from schedrl.types import Sample


def learner_advantages(
    algo: AlgoConfig, samples: Sequence[Sample], groups: torch.Tensor, adv: torch.Tensor
) -> torch.Tensor:
    """What the learner trains on: the group advantages (B,), or with `algo.turn_credit: return_to_go`
    one per token (B, L-1), each token its turn's (see `schedrl.algos.turn_credit`)."""
    if algo.turn_credit == "broadcast":
        return adv
    turn_rewards = [s.turn_rewards if s.turn_rewards is not None else (s.reward or 0.0,) for s in samples]
    per_turn = turn_advantages(turn_rewards, groups, algo.turn_discount, algo.std_normalize)
    tokens = [
        per_token(a, s.turns if s.turns is not None else [0] * len(s.token_ids))
        for a, s in zip(per_turn, samples, strict=True)
    ]
    return target_rows([s.prompt_ids for s in samples], [s.token_ids for s in samples], tokens)


@dataclass
class UpdateBatch:
    update: int  # the update that trains on it (0-based)
    samples: list[Sample]
    masks: list[list[bool]]  # per sample, per completion token: trained on (True) or context only
    rewards: torch.Tensor  # (B,)
    groups: torch.Tensor  # (B,) group index of each sample
    adv: torch.Tensor  # (B,) group advantages
    learner_adv: torch.Tensor  # what the learner trains on: `adv`, or (B, L-1) per-turn ones
    plan: list = dataclasses.field(default_factory=list)  # (task, samples) per group, for the metrics

    @classmethod
    def of(cls, groups: Sequence[Group], update: int, bound: StalenessBound, stale: str, algo: AlgoConfig):
        """The batch of `groups` for `update`; every sample in them must be trainable (stale ones purged)."""
        samples = [smp for g in groups for smp in g.samples()]
        masks = []
        for smp in samples:
            mask = bound.trainable(update, smp.versions, stale, smp.trained)
            if mask is None:
                raise ValueError(f"sample {smp.request_id} is too stale for update {update}; purge it first")
            masks.append(mask)
        rewards = torch.tensor([smp.reward for smp in samples])
        index = group_index(samples)
        adv = registry.get("advantage", algo.advantage)(rewards, index, std_normalize=algo.std_normalize)
        if algo.task_normalize:  # AgentRL: each task type's advantages standardised among themselves
            domains = [g.task.domain for g in groups for _ in g.samples()]
            labels = {d: i for i, d in enumerate(dict.fromkeys(domains))}
            adv = task_normalized(adv, torch.tensor([labels[d] for d in domains]))
        plan = [(g.task, len(g.samples())) for g in groups]
        return cls(
            update, samples, masks, rewards, index, adv, learner_advantages(algo, samples, index, adv), plan
        )

    def learner_batch(self, max_staleness: int) -> LearnerBatch:
        """What the learner worker's `update` trains on: plain lists, so it crosses process boundaries."""
        s = self.samples
        return LearnerBatch(
            prompt_ids=[list(x.prompt_ids) for x in s],
            token_ids=[list(x.token_ids) for x in s],
            logprobs=[list(x.logprobs) for x in s],
            versions=[list(x.versions) for x in s],
            train_mask=self.masks,
            advantages=self.learner_adv.tolist(),
            request_ids=[x.request_id for x in s],
            max_staleness=max_staleness,
        )

    def record_metrics(self, bound: StalenessBound, dropped_so_far: int) -> dict[str, float]:
        """The batch's metrics; counts its trained tokens' staleness into `bound`'s run histogram."""
        hist = bound.record(self.update, [smp.versions for smp in self.samples], self.masks)
        n = max(1, sum(hist.values()))
        return {
            **rollout_metrics(self.samples, self.rewards, self.groups),
            **scheduler_metrics(self.plan),
            "staleness_mean": sum(k * v for k, v in hist.items()) / n,
            "staleness_max": float(max(hist, default=0)),
            **{f"staleness_hist/{k}": float(v) for k, v in sorted(hist.items())},
            "masked_tokens": float(sum(len(m) - sum(m) for m in self.masks)),
            "dropped_samples": float(dropped_so_far),
            "max_staleness": float(bound.k),
            "batch_groups": float(int(self.groups.max()) + 1),
        }
