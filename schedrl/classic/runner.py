"""The classic PPO runner: it owns the environments, timing, logging, evaluation and checkpoints; the
update's math is `schedrl.classic.ppo` (the RSL-RL split of runner and algorithm).

It writes the run directory an LM run writes: `config.yaml`, `metrics.jsonl` (one row per update,
`step` = updates done), TensorBoard, `checkpoints/` (the crash-consistent protocol of
`schedrl.training.checkpoint`), `timeline.jsonl` (rollout and train spans), `reward.png`, and what
`schedrl report` reads. A checkpoint holds the policy, the optimizer, the observation statistics,
the collector (current observations, running episode returns), the environments themselves
(pickled mid-episode) and the random state, so a resumed run continues exactly: its rows equal an
uninterrupted run's. Environments that cannot be pickled (`vectorization: async`) are reset on
resume instead, and the run says so.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from schedrl.classic.attention import EntityAttentionPolicy
from schedrl.classic.config import ClassicConfig, PolicySection, classic_config_to_dict
from schedrl.classic.envs import evaluate, make_envs, restore, snapshot
from schedrl.classic.imitate import clone
from schedrl.classic.policy import ActorCritic
from schedrl.classic.ppo import PPO
from schedrl.classic.rollout import Collector, ObsNormalizer, RewardScaler
from schedrl.timeline import TIMELINE_FILE, Recorder, append_spans
from schedrl.training.checkpoint import latest_checkpoint, rng_state, set_rng_state, write_checkpoint
from schedrl.training.run_dir import MetricsLogger, RunDir, plot_reward_curve, read_metrics

log = logging.getLogger(__name__)

WINDOW = 100  # episodes in the running mean return (`return_mean_100`), as SB3's `ep_info_buffer`
UpdateCallback = Callable[[int, dict], None]


def make_policy(p: PolicySection, obs_space: gym.Space, act_space: gym.Space) -> Any:
    """The policy a `policy:` section names, for one environment copy's spaces."""
    if p.kind == "attention":
        if (
            not isinstance(act_space, gym.spaces.Discrete)
            or obs_space.shape is None
            or len(obs_space.shape) != 2
        ):
            raise ValueError(
                "config field 'policy.kind': attention needs a Discrete action space and (entities, features) "
                f"observations, got {act_space} and {obs_space}"
            )
        return EntityAttentionPolicy(obs_space.shape[1], p.dim, p.layers, p.heads)
    return ActorCritic.for_spaces(
        obs_space,
        act_space,
        hidden=p.hidden,
        activation=p.activation,
        ortho_init=p.ortho_init,
        log_std_init=p.log_std_init,
    )


class Runner:
    """`Runner(cfg, run, resume).learn(on_update)`; returns the evaluation before and after."""

    def __init__(self, cfg: ClassicConfig, run: RunDir, resume: bool = False) -> None:
        self.cfg, self.run = cfg, run
        torch.manual_seed(cfg.seed)
        torch.set_num_threads(cfg.threads)
        self.envs = make_envs(cfg.env)
        obs_space, act_space = self.envs.single_observation_space, self.envs.single_action_space
        self.policy = make_policy(cfg.policy, obs_space, act_space)
        self.algo = PPO(self.policy, cfg.ppo)
        assert obs_space.shape is not None
        self.norm = ObsNormalizer(obs_space.shape, cfg.env.clip_obs, cfg.env.normalize_obs)
        e = cfg.env
        scaler = RewardScaler(e.num_envs, cfg.ppo.gamma, e.clip_reward, e.normalize_reward)
        self.collector = Collector(self.envs, self.policy, self.norm, cfg.ppo.gamma, scaler)
        self.recent: deque[float] = deque(maxlen=WINDOW)
        self.recent_lengths: deque[int] = deque(maxlen=WINDOW)
        self.episodes = 0
        self.update = 0
        self.seconds = 0.0  # wall-clock of the training loop (evaluations and checkpoints excluded)
        self.state: dict[str, Any] = {}
        ckpt = latest_checkpoint(run.ckpt_dir) if resume else None
        if ckpt is not None:
            self._load(ckpt)
        else:
            self.collector.reset(cfg.seed)
        resume_step = self.update if ckpt is not None else (-1 if resume else None)
        self.logger = MetricsLogger(
            run,
            resume_step=resume_step,
            backends=cfg.logging.backends,
            options=dataclasses.asdict(cfg.logging),
            config=classic_config_to_dict(cfg),
        )
        self.timeline = Recorder("trainer")

    # ---- the loop ----------------------------------------------------------------------------
    def learn(self, on_update: UpdateCallback | None = None) -> dict:
        cfg = self.cfg
        try:
            if "eval_before" not in self.state:
                self.state["eval_before"] = self._evaluate()
                self.logger.log(0, self.state["eval_before"], prefix="eval/")
                if cfg.pretrain.teacher is not None:
                    start = time.perf_counter()
                    self.state["pretrain"] = clone(self.policy, cfg.env, cfg.pretrain, cfg.seed)
                    self.seconds += time.perf_counter() - start  # cloning is part of the training budget
                    self.state["eval_cloned"] = self._evaluate()
                    self.logger.log(0, self.state["pretrain"])
                    self.logger.log(0, self.state["eval_cloned"], prefix="eval_cloned/")
                self._save()
            while self.update < cfg.updates:
                start = time.perf_counter()
                metrics = self._one_update()
                self.logger.log(self.update, metrics)
                self.seconds += time.perf_counter() - start  # the loop's time; evaluations and saves excluded
                if cfg.eval.every and self.update % cfg.eval.every == 0 and self.update < cfg.updates:
                    self.logger.log(self.update, self._evaluate(), prefix="eval/")
                if on_update is not None:
                    on_update(self.update, metrics)
                if self.update == cfg.updates or (cfg.save_every and self.update % cfg.save_every == 0):
                    if self.update == cfg.updates:
                        self.state["eval_after"] = self._evaluate()
                        self.logger.log(self.update, self.state["eval_after"], prefix="eval/")
                    self._save()
            if "eval_after" not in self.state:  # resumed after the last update had been saved
                self.state["eval_after"] = self._evaluate()
        finally:
            self.logger.close()
            self.envs.close()
        rows = read_metrics(self.run.metrics_path)
        if any("reward_mean" in r for r in rows):
            plot_reward_curve(rows, self.run.plot_path, title=f"{cfg.env.id}: episode return per update")
        return {"eval_before": self.state["eval_before"], "eval_after": self.state["eval_after"]}

    def _one_update(self) -> dict[str, float]:
        cfg = self.cfg
        start = time.time()
        steps_before = self.collector.steps
        rollout = self.collector.collect(cfg.ppo.n_steps)
        mid = time.time()
        progress = 1.0 - self.collector.steps / max(cfg.total_steps, 1)
        stats = self.algo.update(rollout, max(progress, 0.0))
        end = time.time()
        self.timeline.add("generate", start, mid)
        self.timeline.add("train", mid, end)
        self.update += 1
        finished = self.collector.take_episodes()
        for ret, length in finished:
            self.recent.append(ret)
            self.recent_lengths.append(length)
        self.episodes += len(finished)
        steps = self.collector.steps - steps_before
        metrics: dict[str, float] = {
            "env_steps": float(self.collector.steps),
            "episodes": float(self.episodes),
            "step_s": end - start,
            "rollout_s": mid - start,
            "train_s": end - mid,
            "env_steps_per_s": steps / max(end - start, 1e-9),
            "elapsed_s": self.seconds + (end - start),
            **stats,
        }
        if finished:
            metrics["reward_mean"] = float(np.mean([r for r, _ in finished]))  # this update's episodes
        if self.recent:
            metrics["return_mean_100"] = float(np.mean(self.recent))
            metrics["ep_len_mean_100"] = float(np.mean(self.recent_lengths))
        solved = cfg.eval.solved_return
        if (
            solved is not None
            and "solved_at_steps" not in self.state
            and len(self.recent) == WINDOW
            and metrics["return_mean_100"] >= solved
        ):
            elapsed = metrics["elapsed_s"]
            self.state["solved_at_steps"], self.state["solved_at_s"] = self.collector.steps, elapsed
            metrics["solved_at_steps"], metrics["solved_at_s"] = float(self.collector.steps), elapsed
        return metrics

    def _evaluate(self) -> dict[str, float]:
        e = self.cfg.eval
        with torch.random.fork_rng():  # evaluation draws nothing from the training stream
            return evaluate(self.policy, self.cfg.env, self.norm, e.episodes, self.cfg.seed, e.deterministic)

    # ---- checkpoints -------------------------------------------------------------------------
    def _save(self) -> None:
        self.logger.sync()
        append_spans(self.run.root / TIMELINE_FILE, self.timeline.drain())
        envs = snapshot(self.envs)
        trainer = {
            "policy": self.policy.state_dict(),
            "algo": self.algo.state_dict(),
            "normalizer": self.norm.state_dict(),
            "collector": self.collector.state_dict(),
            "recent": (list(self.recent), list(self.recent_lengths), self.episodes, self.seconds),
            "envs": envs,
        }
        state = {"step": self.update, **self.state}

        def write(tmp: Path) -> None:
            (tmp / "model").mkdir()
            torch.save(
                {"state_dict": self.policy.state_dict(), "normalizer": self.norm.state_dict()},
                tmp / "model" / "policy.pt",
            )
            torch.save(trainer, tmp / "trainer.pt")
            torch.save(rng_state(), tmp / "rng.pt")
            (tmp / "state.json").write_text(json.dumps(state, indent=1))

        write_checkpoint(self.run.ckpt_dir, self.update, write, self.cfg.keep_last)

    def _load(self, ckpt: Path) -> None:
        trainer = torch.load(ckpt / "trainer.pt", weights_only=False)
        state = json.loads((ckpt / "state.json").read_text())
        self.policy.load_state_dict(trainer["policy"])
        self.algo.load_state_dict(trainer["algo"])
        self.norm.load_state_dict(trainer["normalizer"])
        recent, lengths, self.episodes, self.seconds = trainer["recent"]
        self.recent.extend(recent)
        self.recent_lengths.extend(lengths)
        self.update = state.pop("step")
        self.state = state
        if trainer["envs"] is not None:
            self.envs = restore(self.envs, trainer["envs"])
            self.collector.envs = self.envs
            self.collector.load_state_dict(trainer["collector"])
        else:
            log.warning(
                "the environments of %s could not be saved (env.vectorization=%s): they are reset, so the "
                "resumed run does not replay the uninterrupted one exactly",
                ckpt,
                self.cfg.env.vectorization,
            )
            steps = trainer["collector"]["steps"]
            self.collector.reset(self.cfg.seed + 7919 * self.update)
            self.collector.steps = steps
        set_rng_state(torch.load(ckpt / "rng.pt", weights_only=False))
        log.info(
            "resuming %s from update %d (%d environment steps)",
            self.run.root,
            self.update,
            self.collector.steps,
        )


def train_classic(
    cfg: ClassicConfig, run: RunDir, resume: bool = False, on_update: UpdateCallback | None = None
) -> dict:
    """Run (or resume) a classic PPO run; returns the evaluation before and after, and where it is."""
    runner = Runner(cfg, run, resume)
    out = runner.learn(on_update)
    keys = ("solved_at_steps", "solved_at_s", "pretrain", "eval_cloned")
    solved = {k: runner.state[k] for k in keys if k in runner.state}
    return {**out, **solved, "run_dir": str(run.root), "plot": str(run.plot_path), "seconds": runner.seconds}
