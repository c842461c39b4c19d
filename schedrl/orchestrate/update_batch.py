"""One update's batch in the asynchronous pipeline: its groups' samples, trained-token masks,
group advantages, the payload the learner worker receives, and the batch's metrics."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from schedrl.algos import registry
from schedrl.config import AlgoConfig
from schedrl.orchestrate.buffer import Group
from schedrl.orchestrate.staleness import StalenessBound
from schedrl.orchestrate.step_metrics import rollout_metrics
from schedrl.rollout import group_index
from schedrl.types import Sample


@dataclass
class UpdateBatch:
    update: int  # the update that trains on it (0-based)
    samples: list[Sample]
    masks: list[list[bool]]  # per sample, per completion token: trained on (True) or context only
    rewards: torch.Tensor  # (B,)
    groups: torch.Tensor  # (B,) group index of each sample
    adv: torch.Tensor  # (B,) group advantages

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
        return cls(update, samples, masks, rewards, index, adv)

    def payload(self, max_staleness: int) -> dict:
        """What the learner worker's `update` reads: plain lists, so it crosses process boundaries."""
        s = self.samples
        return {
            "prompt_ids": [list(x.prompt_ids) for x in s],
            "token_ids": [list(x.token_ids) for x in s],
            "logprobs": [list(x.logprobs) for x in s],
            "versions": [list(x.versions) for x in s],
            "train_mask": self.masks,
            "advantages": self.adv.tolist(),
            "request_ids": [x.request_id for x in s],
            "max_staleness": max_staleness,
        }

    def record_metrics(self, bound: StalenessBound, dropped_so_far: int) -> dict[str, float]:
        """The batch's metrics; counts its trained tokens' staleness into `bound`'s run histogram."""
        hist: Counter = Counter()
        for smp, m in zip(self.samples, self.masks, strict=True):
            hist += bound.record(self.update, smp.versions, m)
        n = max(1, sum(hist.values()))
        return {
            **rollout_metrics(self.samples, self.rewards, self.groups),
            "staleness_mean": sum(k * v for k, v in hist.items()) / n,
            "staleness_max": float(max(hist, default=0)),
            **{f"staleness_hist/{k}": float(v) for k, v in sorted(hist.items())},
            "masked_tokens": float(sum(len(m) - sum(m) for m in self.masks)),
            "dropped_samples": float(dropped_so_far),
            "max_staleness": float(bound.k),
            "batch_groups": float(int(self.groups.max()) + 1),
        }
