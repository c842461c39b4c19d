"""One update's batch, in both loops: its groups' samples, trained-token masks, group advantages, the
payload the learner worker receives, and the batch's metrics.

A sample is one episode. A folded episode (`schedrl.rollout.folding`) trains as several rows, one per
segment, each with the episode's advantage."""

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
    """What the learner trains on, per row (`Sample.rows`: a folded episode's segments, then the sample):
    each row its episode's group advantage (R,), or with `algo.turn_credit: return_to_go` one per token
    (R, L-1), each token its turn's (see `schedrl.algos.turn_credit`)."""
    if algo.turn_credit == "broadcast":
        return torch.stack([a for a, s in zip(adv, samples, strict=True) for _ in s.rows()])
    turn_rewards = [s.turn_rewards if s.turn_rewards is not None else (s.reward or 0.0,) for s in samples]
    per_turn = turn_advantages(turn_rewards, groups, algo.turn_discount, algo.std_normalize)
    rows = [(a, r) for a, s in zip(per_turn, samples, strict=True) for r in s.rows()]
    tokens = [per_token(a, r.turns if r.turns is not None else [0] * len(r.token_ids)) for a, r in rows]
    return target_rows([r.prompt_ids for _, r in rows], [r.token_ids for _, r in rows], tokens)


def duration_weights(samples: Sequence[Sample]) -> torch.Tensor:
    """ML-engineering agents' duration-aware update: each episode's weight is its environment time over
    the batch's mean (1 where the batch took no time), so an action that takes long counts as much per
    second as the fast ones that finish and train more often."""
    d = torch.tensor([s.env_s or 0.0 for s in samples], dtype=torch.float64)
    mean = d.mean() if len(d) else torch.tensor(0.0)
    return (d / mean).float() if mean > 0 else torch.ones(len(samples))


@dataclass
class UpdateBatch:
    update: int  # the update that trains on it (0-based)
    samples: list[Sample]  # one per episode
    masks: list[list[bool]]  # per row, per completion token: trained on (True) or context only
    rewards: torch.Tensor  # (B,)
    groups: torch.Tensor  # (B,) group index of each sample
    adv: torch.Tensor  # (B,) group advantages
    learner_adv: torch.Tensor  # what the learner trains on, per row: (R,), or (R, L-1) per-turn ones
    plan: list = dataclasses.field(default_factory=list)  # (task, samples) per group, for the metrics

    @classmethod
    def of(cls, groups: Sequence[Group], update: int, bound: StalenessBound, stale: str, algo: AlgoConfig):
        """The batch of `groups` for `update`; every sample in them must be trainable (stale ones purged)."""
        samples = [smp for g in groups for smp in g.samples()]
        masks = []
        for row in (r for smp in samples for r in smp.rows()):
            mask = bound.trainable(update, row.versions, stale, row.trained)
            if mask is None:
                raise ValueError(f"sample {row.request_id} is too stale for update {update}; purge it first")
            masks.append(mask)
        rewards = torch.tensor([smp.reward for smp in samples])
        index = group_index(samples)
        adv = registry.get("advantage", algo.advantage)(rewards, index, std_normalize=algo.std_normalize)
        if algo.task_normalize:  # AgentRL: each task type's advantages standardised among themselves
            domains = [g.task.domain for g in groups for _ in g.samples()]
            labels = {d: i for i, d in enumerate(dict.fromkeys(domains))}
            adv = task_normalized(adv, torch.tensor([labels[d] for d in domains]))
        plan = [(g.task, len(g.samples())) for g in groups]
        learner_adv = learner_advantages(algo, samples, index, adv)
        if algo.duration_aware:
            w = duration_weights(samples)
            per_row = torch.cat([w[i].repeat(len(s.rows())) for i, s in enumerate(samples)])
            learner_adv = learner_adv * (per_row if learner_adv.dim() == 1 else per_row[:, None])
        return cls(update, samples, masks, rewards, index, adv, learner_adv, plan)

    @property
    def rows(self) -> list[Sample]:
        """The sequences trained: each sample's segments, then the sample (`Sample.rows`)."""
        return [r for smp in self.samples for r in smp.rows()]

    def learner_batch(self, max_staleness: int) -> LearnerBatch:
        """What the learner worker's `update` trains on: plain lists, so it crosses process boundaries."""
        s = self.rows
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
        rows = self.rows
        hist = bound.record(self.update, [r.versions for r in rows], self.masks)
        n = max(1, sum(hist.values()))
        folded = (
            {"fold/segments_mean": len(rows) / len(self.samples)} if len(rows) > len(self.samples) else {}
        )
        return {
            **folded,
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
