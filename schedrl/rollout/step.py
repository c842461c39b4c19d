"""One synchronous step's rollout, with the rollout features the config switches on.

`StepRollout.run(requests, score)` returns every request's scored sample, in request
order, and the step's rollout metrics, in the schedule's rollout mode (`schedule.rollout`,
`schedrl.rollout.modes`). Plain, it is `engine.generate`. Speculative: each request whose (task,
sample index) was rolled out before takes that sample as a draft and is verified by one forward of
the current policy (`speculative.verify_drafts`); what verification does not finish runs on the
engine from its accepted prefix. Pruning: groups are over-provisioned to `sampling.group_size` and
each is pruned online to `keep` members (`pruning.pruned_rollout`); pruned samples are dropped from
the loss or kept (its `mode`).

Speculative verification needs the draft policy's whole distribution at a rejected
position, so the weights that sampled each draft are kept for `draft_versions` steps;
a draft more than `draft_versions` versions old is not used (its request runs from
scratch).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from schedrl.envs.base import Task
from schedrl.envs.sessions import pool_metrics
from schedrl.rollout.episodes import EpisodeRunner
from schedrl.rollout.modes import ROLLOUT_MODES, Pruning, Speculative
from schedrl.rollout.pruning import PruneConfig, SuccessHead, pruned_rollout, training_samples
from schedrl.rollout.speculative import DraftStore, SpecStats, verify_drafts
from schedrl.seeding import derive_seed
from schedrl.types import Request, Sample

if TYPE_CHECKING:
    from schedrl.config import RunConfig
    from schedrl.engine import Engine

Score = Callable[[Sequence[Sample]], Sequence[float | None]]  # None: not known yet, the sample stays unscored


class StepRollout:
    """The synchronous loop's rollout of one step: plain generation on the engine, or with online pruning
    (ARRoL) or speculative reuse of earlier rollouts (SPEC-RL), as the run's `rollout` section says."""

    def __init__(
        self,
        cfg: RunConfig,
        engine: Engine,
        model: torch.nn.Module,
        tokenizer: Any,
        episodes: EpisodeRunner | None = None,
    ) -> None:
        """`episodes`: run each request as a multi-turn episode (a task with tools or another environment)."""
        self.seed = cfg.seed
        mode = ROLLOUT_MODES.build(cfg.schedule.rollout, cfg.schedule.rollout_args)
        self.episodes = episodes
        self.engine, self.model, self.tokenizer = engine, model, tokenizer
        speculative = isinstance(mode, Speculative)
        self.draft_versions = mode.args.draft_versions if speculative else 0
        self.drafts = DraftStore() if speculative else None
        self.draft_weights: dict[
            int, dict[str, torch.Tensor]
        ] = {}  # version -> the weights that sampled at it
        self.draft_model = copy.deepcopy(model).eval().requires_grad_(False) if speculative else None
        self.prune = PruneConfig(**vars(mode.args)) if isinstance(mode, Pruning) else None
        self.head = SuccessHead()  # the pruner's success predictor (trained only when pruning)

    def run(
        self, requests: Sequence[Request], score: Score, tasks: dict[str, Task] | None = None
    ) -> tuple[list[Sample], dict[str, float]]:
        """Scored samples of `requests` (pruned ones dropped under prune_mode "drop") and rollout metrics.
        Episodes are scored by their environment and need `tasks` (by id).

        The engine's weights are the policy's, at version `engine.version`."""
        if self.episodes is not None:
            return self._episodes(requests, tasks or {})
        if self.prune is not None:
            samples = pruned_rollout(self.engine, requests, self.head, lambda s: _known(score, s), self.prune)
            pruned = sum(s.finish_reason == "pruned" for s in samples)
            return training_samples(samples, self.prune.mode), {"pruned_samples": float(pruned)}
        if self.drafts is None:
            samples = self.engine.generate(requests)
            return _scored(samples, score), {}
        version = self.engine.version
        for v in [v for v in self.draft_weights if v < version - self.draft_versions]:
            del self.draft_weights[v]  # drafts of version v are not used from here on
        self.drafts.drop_before(version - self.draft_versions)
        samples, stats = self._speculative(requests, version)
        self.drafts.put(samples)
        self.draft_weights[version] = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return _scored(samples, score), {
            "spec_drafts": float(stats.drafts),
            "spec_draft_tokens": float(stats.draft_tokens),
            "spec_accepted_tokens": float(stats.accepted),
            "spec_rejected": float(stats.rejected),
            "spec_acceptance": stats.acceptance_rate,
            "spec_completed": float(stats.completed),
        }

    def _episodes(
        self, requests: Sequence[Request], tasks: dict[str, Task]
    ) -> tuple[list[Sample], dict[str, float]]:
        assert self.episodes is not None
        samples = self.episodes.run(requests, tasks)
        kept = [s for s in samples if s.token_ids]  # an episode whose environment failed at reset has none
        if not kept:
            raise RuntimeError(
                f"every one of the step's {len(samples)} episodes ended before the model's first token "
                f"(environment errors so far: {self.episodes.env_errors}); check the environment's reset"
            )
        stats = {
            "env_errors": float(self.episodes.env_errors),
            "episodes_dropped": float(len(samples) - len(kept)),
            **self.episodes.last_stats,
            **{f"tool/{k}": float(v) for k, v in sorted(self.episodes.tool_counts.items())},
            **pool_metrics(),
            **self.episodes.context_counters(),
        }
        return kept, stats

    def close(self) -> None:
        if self.episodes is not None:
            self.episodes.close()

    def _speculative(self, requests: Sequence[Request], version: int) -> tuple[list[Sample], SpecStats]:
        """Verify every usable draft, grouped by the version that sampled it; run the rest on the engine."""
        if self.drafts is None or self.draft_model is None:
            raise ValueError("speculative rollout needs schedule.rollout: speculative")
        out: list[Sample | Request] = list(requests)
        by_version: dict[int, list[int]] = {}
        for i, req in enumerate(requests):
            d = self.drafts.get(req)
            if d is not None and len(set(d.versions)) == 1 and d.versions[0] in self.draft_weights:
                by_version.setdefault(d.versions[0], []).append(i)
        stats = SpecStats()
        for v, idx in sorted(by_version.items()):
            self.draft_model.load_state_dict(self.draft_weights[v])
            done, s = verify_drafts(
                self.model,
                [requests[i] for i in idx],
                [self.drafts.get(requests[i]) for i in idx],
                eos_ids=self.engine.eos_ids,
                tokenizer=self.tokenizer,
                draft_model=self.draft_model,
                version=version,
                seed=derive_seed(self.seed, "spec", version, v),
            )
            stats.add(s)
            for i, x in zip(idx, done, strict=True):
                out[i] = x
        pending = [x for x in out if isinstance(x, Request)]
        ran = {s.request_id: s for s in self.engine.generate(pending)}
        return [ran[x.id] if isinstance(x, Request) else x for x in out], stats


def _scored(samples: list[Sample], score: Score) -> list[Sample]:
    return [replace(s, reward=r) for s, r in zip(samples, score(samples), strict=True)]


def _known(score: Score, sample: Sample) -> float:
    """The reward of `sample`, which pruning needs now (a delayed reward is refused with it at build)."""
    reward = score([sample])[0]
    if reward is None:
        raise ValueError(f"sample {sample.request_id!r}: pruning needs its reward now; it is not known yet")
    return reward
