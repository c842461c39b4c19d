"""The learner: applies a registered loss to a batch with micro-batching and an optimizer.

It owns the math's surroundings (forward passes, gradient accumulation, clipping,
learning-rate schedule, the non-finite guard), never the math itself: the loss is a
pure function looked up by name in `schedrl.algos`.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
from collections import defaultdict
from dataclasses import asdict

import torch

from schedrl.algos import entropy_from_logits, masked_mean, registry, token_logprobs
from schedrl.config import AlgoConfig, OptimConfig
from schedrl.train.batch import TokenBatch
from schedrl.train.schedules import make_schedule

log = logging.getLogger(__name__)


_LOSS_KWARGS = ("clip_eps", "clip_eps_high", "agg", "ref_logp", "kl_coef", "kl_estimator")


def _learner_losses() -> list[str]:
    """Registered losses that take every keyword the learner passes."""
    return [
        name for name in registry.available("loss")
        if all(k in inspect.signature(registry.get("loss", name)).parameters for k in _LOSS_KWARGS)
    ]  # fmt: skip


class NonFiniteLossError(RuntimeError):
    """Too many optimizer steps in a row had a non-finite loss or gradient."""


class Learner:
    def __init__(
        self,
        model: torch.nn.Module,
        optim: OptimConfig,
        algo: AlgoConfig,
        total_steps: int,
        temperature: float = 1.0,
        ref_model: torch.nn.Module | None = None,
        seed: int = 0,
    ) -> None:
        self.model, self.ref_model = model.train(), ref_model
        self.cfg, self.algo = optim, algo
        self.temperature = temperature if temperature > 0 else 1.0
        self.seed = seed
        self.device = next(model.parameters()).device
        self.loss_fn = registry.get("loss", algo.name)
        accepted = inspect.signature(self.loss_fn).parameters
        missing = [k for k in _LOSS_KWARGS if k not in accepted]
        if missing:
            raise ValueError(
                f"algo.name={algo.name!r}: the learner passes {', '.join(_LOSS_KWARGS)} to the loss, and this "
                f"loss does not take {', '.join(missing)}; pick one of: {', '.join(_learner_losses())}"
            )
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay
        )
        schedule = make_schedule(optim.schedule, optim.lr, optim.warmup_steps, total_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: schedule(s) / optim.lr)
        self.bad_in_a_row = 0
        self.skipped_steps = 0

    def _autocast(self):
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _forward(self, model: torch.nn.Module, batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token log-probs (B, L-1) of the targets and the logits (B, L-1, V)."""
        with self._autocast():
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
        logits = logits.float()
        return token_logprobs(logits, batch.targets, self.temperature), logits

    @torch.no_grad()
    def logprobs(self, model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
        """Log-probs of every target under `model`, in micro-batches, without gradients."""
        out = torch.zeros_like(batch.mask)
        for idx in torch.arange(len(batch)).split(self.cfg.micro_batch_size):
            mb = batch.select(idx).to(self.device)
            out[idx, : mb.targets.shape[1]] = self._forward(model, mb)[0].cpu()
        return out

    def update(self, batch: TokenBatch, advantages: torch.Tensor, step: int) -> dict[str, float]:
        """One training step: `ppo_epochs` passes of `minibatches` optimizer steps over `batch`."""
        n = len(batch)
        several_updates = self.cfg.ppo_epochs * self.cfg.minibatches > 1
        # pi_old: the policy before this step's first update (recomputed only when it can differ from pi_theta).
        old_logp = self.logprobs(self.model, batch) if several_updates else None
        ref_logp = self.logprobs(self.ref_model, batch) if self.algo.kl_coef > 0 else None
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        sums: dict[str, float] = defaultdict(float)
        updates = 0
        for _ in range(self.cfg.ppo_epochs):
            perm = torch.randperm(n, generator=gen) if several_updates else torch.arange(n)
            for mb_inds in perm.tensor_split(self.cfg.minibatches):
                stats = self._minibatch(batch, advantages, mb_inds, old_logp, ref_logp)
                for k, v in stats.items():
                    sums[k] += v
                updates += 1
        self.scheduler.step()
        out = {k: v / updates for k, v in sums.items()}
        out["lr"] = self.scheduler.get_last_lr()[0]
        out["skipped_steps"] = float(self.skipped_steps)
        return out

    def _minibatch(self, batch, advantages, mb_inds, old_logp, ref_logp) -> dict[str, float]:
        self.optimizer.zero_grad(set_to_none=True)
        mb_tokens = float(batch.mask[mb_inds].sum().clamp(min=1))
        sums: dict[str, float] = defaultdict(float)
        finite = True
        for idx in mb_inds.split(self.cfg.micro_batch_size):
            mb = batch.select(idx).to(self.device)
            logp, logits = self._forward(self.model, mb)
            width = logp.shape[1]
            old = old_logp[idx, :width].to(self.device) if old_logp is not None else logp.detach()
            ref = ref_logp[idx, :width].to(self.device) if ref_logp is not None else None
            loss, stats = self.loss_fn(
                logp, old, advantages[idx].to(self.device), mb.mask,
                clip_eps=self.algo.clip_eps, clip_eps_high=self.algo.clip_eps_high, agg=self.algo.loss_agg,
                ref_logp=ref, kl_coef=self.algo.kl_coef, kl_estimator=self.algo.kl_estimator,
            )  # fmt: skip
            bonus_logits = (
                logits if self.algo.entropy_coef else logits.detach()
            )  # grad only when it is a bonus
            entropy = masked_mean(entropy_from_logits(bonus_logits), mb.mask, self.algo.loss_agg)
            if self.algo.entropy_coef:
                loss = loss - self.algo.entropy_coef * entropy
            # Each micro-batch's mean is weighted by its share of the minibatch.
            share = (
                float(mb.mask.sum()) / mb_tokens
                if self.algo.loss_agg == "token_mean"
                else len(idx) / len(mb_inds)
            )
            if not torch.isfinite(loss):
                finite = False
                break
            (loss * share).backward()
            sums["loss"] += loss.item() * share
            sums["entropy"] += entropy.item() * share
            sums["behaviour_vs_learner_abs_logp"] += float(
                ((mb.behaviour_logp - logp.detach()).abs() * mb.mask).sum() / mb_tokens
            )
            for k, v in stats.items():
                sums[k] += v * share
        grad_norm = self._clip() if finite else math.nan
        if not (finite and math.isfinite(grad_norm)):
            return self._skip(sums)
        self.optimizer.step()
        self.bad_in_a_row = 0
        sums["grad_norm"] = grad_norm
        return dict(sums)

    def _clip(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.cfg.max_grad_norm if self.cfg.max_grad_norm > 0 else math.inf
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))

    def _skip(self, sums: dict[str, float]) -> dict[str, float]:
        self.optimizer.zero_grad(set_to_none=True)
        self.bad_in_a_row += 1
        self.skipped_steps += 1
        log.warning("non-finite loss or gradient: optimizer step skipped (%d in a row)", self.bad_in_a_row)
        if self.bad_in_a_row >= self.cfg.max_bad_steps:
            raise NonFiniteLossError(
                f"stopping: {self.bad_in_a_row} optimizer steps in a row had a non-finite loss or gradient "
                f"(optim.max_bad_steps={self.cfg.max_bad_steps})"
            )
        return {k: v for k, v in sums.items() if math.isfinite(v)}

    def state_dict(self) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "bad_in_a_row": self.bad_in_a_row,
            "skipped_steps": self.skipped_steps,
            "optim_config": asdict(self.cfg),
        }

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.bad_in_a_row = state["bad_in_a_row"]
        self.skipped_steps = state["skipped_steps"]
