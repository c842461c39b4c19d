"""Gymnasium vector environments from an `env:` section, their snapshots for exact resume, and the
held-out evaluation.

Training copies are seeded `seed, seed + 1, ...` by one `reset(seed=seed)`; evaluation episodes use
seeds from `EVAL_SEED_BASE + seed * 100_000` on, so no evaluation episode replays a training start.
"""

from __future__ import annotations

import difflib
import importlib
import pickle

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from schedrl.classic.config import EnvSection
from schedrl.classic.policy import ActorCritic
from schedrl.classic.rollout import ObsNormalizer, action_mask

EVAL_SEED_BASE = 10**8

# schedrl's own environments, made on first use (job-shop-lib is imported only then)
if "schedrl/JobShop-v0" not in gym.registry:
    gym.register("schedrl/JobShop-v0", entry_point="schedrl.envs.scheduling.jobshop_env:make_jobshop")
if "schedrl/DAGSched-v0" not in gym.registry:
    gym.register("schedrl/DAGSched-v0", entry_point="schedrl.envs.scheduling.dag_env:make_dag_env")
if "schedrl/Admission-v0" not in gym.registry:
    gym.register(
        "schedrl/Admission-v0", entry_point="schedrl.envs.scheduling.admission_env:make_admission_env"
    )


def make_envs(e: EnvSection, num_envs: int | None = None) -> gym.vector.VectorEnv:
    """`gymnasium.make_vec` of the section: an unknown id names the field and the ids it resembles."""
    if e.module is not None:
        try:
            importlib.import_module(e.module)
        except ImportError as err:
            raise ValueError(f"config field 'env.module': cannot import {e.module!r}: {err}") from None
    if e.id not in gym.registry:
        close = difflib.get_close_matches(e.id, list(gym.registry), n=5, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"config field 'env.id': {e.id!r} is not a registered Gymnasium environment{hint}")
    kwargs = dict(e.kwargs)
    if e.max_episode_steps is not None:
        kwargs["max_episode_steps"] = e.max_episode_steps
    n = num_envs or e.num_envs
    if e.vectorization == "vector_entry_point":
        if e.autoreset is not None:
            raise ValueError(
                "config field 'env.autoreset': a batched implementation (env.vectorization: "
                "vector_entry_point) resets in its own mode; leave env.autoreset null"
            )
        return gym.make_vec(e.id, num_envs=n, vectorization_mode=e.vectorization, **kwargs)
    mode = AutoresetMode.NEXT_STEP if e.autoreset == "next_step" else AutoresetMode.SAME_STEP
    return gym.make_vec(
        e.id, num_envs=n, vectorization_mode=e.vectorization, vector_kwargs={"autoreset_mode": mode}, **kwargs
    )


def snapshot(envs: gym.vector.VectorEnv) -> bytes | None:
    """The pickled state of `envs` (every copy mid-episode, with its random generator), or None where it
    cannot be taken (copies in other processes): resume then resets them."""
    if isinstance(envs, gym.vector.AsyncVectorEnv):
        return None
    try:
        if isinstance(envs, gym.vector.SyncVectorEnv):  # its factories are local functions; its copies pickle
            return pickle.dumps({"envs": envs.envs, "autoreset": envs._autoreset_envs})
        return pickle.dumps({"vector": envs})
    except (pickle.PicklingError, TypeError, AttributeError):  # an environment holding a closure, a socket
        return None


def restore(envs: gym.vector.VectorEnv, data: bytes) -> gym.vector.VectorEnv:
    state = pickle.loads(data)
    if "vector" in state:
        envs.close()
        return state["vector"]
    assert isinstance(envs, gym.vector.SyncVectorEnv)
    for env in envs.envs:
        env.close()
    envs.envs, envs._autoreset_envs = state["envs"], state["autoreset"]
    return envs


def evaluate(
    policy: ActorCritic,
    e: EnvSection,
    norm: ObsNormalizer,
    episodes: int,
    seed: int,
    deterministic: bool = True,
) -> dict[str, float]:
    """Mean, std, min and max return and the mean length of `episodes` held-out episodes, run side by side
    (one per copy, at most 16 copies at a time), observations normalized with frozen statistics."""
    returns: list[float] = []
    lengths: list[int] = []
    first = EVAL_SEED_BASE + seed * 100_000
    while len(returns) < episodes:
        n = min(16, episodes - len(returns))
        envs = make_envs(e, n)
        try:
            start = first + len(returns)
            # one seed per copy; a batched implementation takes one seed and derives its copies' from it
            seeds = start if e.vectorization == "vector_entry_point" else [start + i for i in range(n)]
            obs, infos = envs.reset(seed=seeds)  # type: ignore[arg-type]
            mask = action_mask(infos, n, None)
            total, length = np.zeros(n), np.zeros(n, dtype=np.int64)
            done = np.zeros(n, dtype=bool)
            while not done.all():
                o = torch.from_numpy(norm(np.asarray(obs), update=False))
                action = policy.act(o, None if mask is None else torch.from_numpy(mask), deterministic)[
                    0
                ].numpy()
                space = envs.single_action_space
                if isinstance(space, gym.spaces.Box):
                    action = np.clip(action, space.low, space.high)
                obs, reward, terminated, truncated, infos = envs.step(action)
                total += np.asarray(reward) * ~done
                length += ~done
                done |= np.asarray(terminated) | np.asarray(truncated)
                mask = action_mask(infos, n, None)
        finally:
            envs.close()
        returns += total.tolist()
        lengths += length.tolist()
    r = np.asarray(returns)
    return {
        "return_mean": float(r.mean()),
        "return_std": float(r.std()),
        "return_min": float(r.min()),
        "return_max": float(r.max()),
        "length_mean": float(np.mean(lengths)),
    }
