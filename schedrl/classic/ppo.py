"""The PPO update of a classic run: the math only (the runner owns timing, logging and checkpoints).

It is the LM learner's PPO on a different shape, from the same pure functions: `algos.ppo.gae` (with
episode ends and a bootstrap value), `algos.losses.ppo_clip_loss`, `algos.ppo.value_loss` and the
entropy of `algos.losses.entropy_from_logits`. A transition is a one-token sequence to them.

    loss = L_clip + vf_coef * L_V - ent_coef * H

L_V is PPO2's 0.5 * max((V - R)^2, (V_clip - R)^2), or 0.5 (V - R)^2 without `clip_range_vf`.
Stable-Baselines3 drops the 0.5: its `vf_coef` c equals 2c here. A minibatch whose loss or gradient
is not finite is skipped (the optimizer's state untouched) and counted; `max_bad_steps` of them in a
row stop the run.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from schedrl.algos.losses import ppo_clip_loss
from schedrl.algos.ppo import gae, value_loss
from schedrl.classic.config import PPOSection
from schedrl.classic.policy import ActorCritic
from schedrl.classic.rollout import Rollout
from schedrl.training.optimizer import adamw


class NonFiniteError(RuntimeError):
    """Too many minibatches in a row had a loss or gradient that is not finite."""


def advantages(r: Rollout, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """GAE over the rollout, (T, N) -> (advantages, returns), 0 on invalid steps."""
    adv, ret = gae(
        r.rewards.T, r.values.T, r.valid.T, gamma, lam, ends=r.ends.T, last_value=r.last_value
    )  # rows: one per environment copy
    return adv.T, ret.T


def schedule(base: float, kind: str, progress_remaining: float) -> float:
    """The value of a `constant` or `linear` (to 0 at the end) schedule."""
    return base * progress_remaining if kind == "linear" else base


class PPO:
    """Adam (eps 1e-5, as SB3 and CleanRL) on `policy`; `update(rollout, progress_remaining)`."""

    def __init__(self, policy: ActorCritic, p: PPOSection) -> None:
        self.policy, self.p = policy, p
        self.optimizer = adamw(policy.parameters(), lr=p.lr, eps=1e-5, weight_decay=0.0)
        self.bad_in_a_row = 0
        self.skipped = 0

    def update(self, r: Rollout, progress_remaining: float, generator: torch.Generator | None = None) -> dict:
        p = self.p
        lr = schedule(p.lr, p.lr_schedule, progress_remaining)
        clip = schedule(p.clip_range, p.clip_schedule, progress_remaining)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        adv_all, ret_all = advantages(r, p.gamma, p.gae_lambda)
        keep = r.valid.reshape(-1)
        obs = r.obs.reshape(-1, *r.obs.shape[2:])[keep]
        actions = r.actions.reshape(-1, *r.actions.shape[2:])[keep]
        old_logp, old_v = r.logp.reshape(-1)[keep], r.values.reshape(-1)[keep]
        adv, ret = adv_all.reshape(-1)[keep], ret_all.reshape(-1)[keep]
        masks = None if r.masks is None else r.masks.reshape(-1, r.masks.shape[-1])[keep]
        n = obs.shape[0]
        sums = torch.zeros(3)  # loss, policy loss, value loss, summed over the minibatches stepped
        logged: dict[str, list[float]] = {}
        count, stopped = 0, False
        for epoch in range(p.n_epochs):
            order = torch.randperm(n, generator=generator)
            last_epoch = epoch == p.n_epochs - 1
            for start in range(0, n, p.batch_size):
                idx = order[start : start + p.batch_size]
                if idx.numel() < 2 and n >= 2:
                    continue  # a one-sample tail cannot be normalized
                with_stats = (
                    last_epoch or p.target_kl is not None
                )  # the ratios' statistics cost as much as a step
                step = self._minibatch(
                    obs[idx],
                    actions[idx],
                    old_logp[idx],
                    old_v[idx],
                    adv[idx],
                    ret[idx],
                    None if masks is None else masks[idx],
                    clip,
                    with_stats,
                )
                if step is None:
                    continue
                losses, stats = step
                sums += losses
                count += 1
                for k, v in stats.items():
                    logged.setdefault(k, []).append(v)
                if p.target_kl is not None and stats["approx_kl"] > 1.5 * p.target_kl:
                    stopped = True
                    break
            if stopped:
                break
        out = {k: sum(v) / len(v) for k, v in logged.items()}
        out.update(zip(("loss", "policy_loss", "value_loss"), (sums / max(count, 1)).tolist(), strict=True))
        with torch.no_grad():
            _, entropy, _ = self.policy.evaluate(obs, actions, masks)
            assert entropy is not None
            var = torch.var(ret)
            explained = 1.0 - float(torch.var(ret - old_v) / var) if n > 1 and var > 0 else 0.0
        out.update(
            entropy=float(entropy.mean()),
            lr=lr,
            clip_range=clip,
            explained_variance=explained,
            minibatches=float(count),
            skipped_minibatches=float(self.skipped),
            early_stop=float(stopped),
        )
        return out

    def _minibatch(
        self, obs, actions, old_logp, old_v, adv, ret, masks, clip, with_stats: bool
    ) -> tuple[Tensor, dict[str, float]] | None:
        """One step on a minibatch: (its loss, policy loss and value loss; the ratios' statistics), or None
        when it was skipped (not finite)."""
        p = self.p
        if p.normalize_advantage and adv.numel() > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        logp, entropy, value = self.policy.evaluate(obs, actions, masks, with_entropy=p.ent_coef > 0)
        ones = torch.ones(obs.shape[0], 1, dtype=torch.bool)
        pg, pg_stats = ppo_clip_loss(
            logp[:, None], old_logp[:, None], adv[:, None], ones, clip_eps=clip, with_stats=with_stats
        )
        vf, _ = value_loss(
            value[:, None], old_v[:, None], ret[:, None], ones, clip_range=p.clip_range_vf, with_stats=False
        )
        loss = pg + p.vf_coef * vf
        if entropy is not None:
            loss = loss - p.ent_coef * entropy.mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), p.max_grad_norm, foreach=True)
        if not math.isfinite(float(loss.detach() + norm)):
            self.optimizer.zero_grad(set_to_none=True)  # skipped: the moments are not touched
            self.skipped += 1
            self.bad_in_a_row += 1
            if self.bad_in_a_row >= p.max_bad_steps:
                raise NonFiniteError(
                    f"{self.bad_in_a_row} minibatches in a row had a loss or gradient that is not finite "
                    f"(ppo.max_bad_steps={p.max_bad_steps}); last loss {loss.item()}, gradient norm {norm.item()}"
                )
            return None
        self.bad_in_a_row = 0
        self.optimizer.step()
        stats = {"clipfrac": pg_stats["clipfrac"], "approx_kl": pg_stats["approx_kl"]} if with_stats else {}
        if with_stats:
            stats["grad_norm"] = float(norm)
        return torch.stack([loss.detach(), pg.detach(), vf.detach()]), stats

    def state_dict(self) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(),
            "bad_in_a_row": self.bad_in_a_row,
            "skipped": self.skipped,
        }

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.bad_in_a_row, self.skipped = state["bad_in_a_row"], state["skipped"]
