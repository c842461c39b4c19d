"""Classic PPO: schedrl against Stable-Baselines3 2.9 PPO with rl-zoo's settings, side by side.

    python bench/classic_ppo.py                      # CartPole-v1 and Acrobot-v1, 3 seeds each
    python bench/classic_ppo.py --envs CartPole-v1 --seeds 1

Each system and seed runs in a fresh process (torch's thread count is per process). Measured: the
wall-clock and the environment steps until the 100-episode mean training return reaches the solved
threshold (475 on CartPole-v1, -100 on Acrobot-v1), from the start of training; and the mean return
of 20 greedy evaluation episodes after the whole budget, on seeds no training episode used. SB3 runs
with rl-zoo's hyperparameters (`hyperparams/ppo.yml`) and its defaults otherwise, `device="cpu"`, one
torch thread (its fastest here; schedrl's recipes use one too);
schedrl runs its recipes in `examples/` (its own hyperparameters, on no more environment steps).

The last line is JSON: `cartpole_vs_sb3_time` and `acrobot_vs_sb3_time` are SB3's median time to
solve over schedrl's (above 1: schedrl is faster). Needs `pip install stable-baselines3` (a
benchmark dependency only).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SOLVED = {"CartPole-v1": 475.0, "Acrobot-v1": -100.0}
RECIPES = {
    "CartPole-v1": ROOT / "examples" / "cartpole_ppo.yaml",
    "Acrobot-v1": ROOT / "examples" / "acrobot_ppo.yaml",
}
EVAL_EPISODES = 20
EVAL_SEED = 10**8  # as schedrl.classic.envs: seeds no training episode starts from


def _linear(start: float):
    return lambda progress_remaining: progress_remaining * start


def rl_zoo(env_id: str) -> tuple[dict, int, int, bool]:
    """(PPO kwargs, n_envs, n_timesteps, normalize) of rl-zoo's ppo.yml."""
    if env_id == "CartPole-v1":
        kwargs = dict(
            n_steps=32,
            batch_size=256,
            gae_lambda=0.8,
            gamma=0.98,
            n_epochs=20,
            ent_coef=0.0,
            learning_rate=_linear(1e-3),
            clip_range=_linear(0.2),
        )
        return kwargs, 8, 100_000, False
    if env_id == "Acrobot-v1":
        return dict(n_steps=256, gae_lambda=0.94, gamma=0.99, n_epochs=4, ent_coef=0.0), 16, 1_000_000, True
    raise ValueError(f"no rl-zoo settings here for {env_id!r}")


def run_sb3(env_id: str, seed: int, budget: int | None) -> dict:
    import numpy as np
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(1)  # SB3 runs fastest so here: 13.9 s per 1e5 CartPole steps, 14.7 s on two
    kwargs, n_envs, steps, normalize = rl_zoo(env_id)
    env: Any = make_vec_env(env_id, n_envs=n_envs, seed=seed)
    if normalize:
        env = VecNormalize(env, gamma=kwargs.get("gamma", 0.99))
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **kwargs)
    solved: dict = {}

    class Solved(BaseCallback):
        def _on_training_start(self) -> None:
            self.start = time.perf_counter()

        def _on_step(self) -> bool:
            buf = self.model.ep_info_buffer
            if (
                not solved
                and buf is not None
                and len(buf) == 100
                and np.mean([e["r"] for e in buf]) >= SOLVED[env_id]
            ):
                solved.update(
                    solved_at_s=time.perf_counter() - self.start, solved_at_steps=self.num_timesteps
                )
            return True

    start = time.perf_counter()
    model.learn(total_timesteps=budget or steps, callback=Solved())
    seconds = time.perf_counter() - start
    returns = []
    eval_env: Any = make_vec_env(env_id, n_envs=1)
    if normalize:
        eval_env = VecNormalize(eval_env, training=False, norm_reward=False)
        eval_env.obs_rms = env.obs_rms
    for k in range(EVAL_EPISODES):  # greedy episodes on held-out seeds
        eval_env.seed(EVAL_SEED + seed * 100_000 + k)
        obs, done, total = eval_env.reset(), False, 0.0
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, dones, infos = eval_env.step(action)
            done = bool(dones[0])
            total += float(eval_env.get_original_reward()[0]) if normalize else float(reward[0])
        returns.append(total)
    return {**solved, "seconds": seconds, "steps": budget or steps, "eval_return": float(np.mean(returns))}


def run_schedrl(env_id: str, seed: int, budget: int | None) -> dict:
    import tempfile

    import schedrl

    with tempfile.TemporaryDirectory() as out:
        overrides: dict[str, Any] = {"total_steps": budget} if budget else {}
        result = schedrl.train(
            RECIPES[env_id],
            seed=seed,
            out_dir=out,
            name="bench",
            logging={"backends": ["jsonl"]},
            **overrides,
        )
        rows = result.metrics
    solved = next((r for r in rows if "solved_at_steps" in r), None)
    out_row = {
        "seconds": max(r["elapsed_s"] for r in rows if "elapsed_s" in r),
        "steps": int(max(r["env_steps"] for r in rows if "env_steps" in r)),
        "eval_return": result.eval_after["return_mean"],
    }
    if solved is not None:
        out_row.update(solved_at_s=solved["solved_at_s"], solved_at_steps=int(solved["solved_at_steps"]))
    return out_row


def child(system: str, env_id: str, seed: int, budget: int | None) -> None:
    fn = run_sb3 if system == "sb3" else run_schedrl
    print(json.dumps(fn(env_id, seed, budget)))


def spawn(system: str, env_id: str, seed: int, budget: int | None) -> dict:
    cmd = [sys.executable, __file__, "--child", system, env_id, str(seed)]
    if budget:
        cmd += ["--budget", str(budget)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{system} {env_id} seed {seed} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description="classic PPO: schedrl against Stable-Baselines3")
    parser.add_argument("--envs", nargs="+", default=list(SOLVED))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--budget", type=int, default=None, help="environment steps per run (default: rl-zoo's)"
    )
    parser.add_argument("--child", nargs=3, metavar=("SYSTEM", "ENV", "SEED"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]), args.budget)
        return
    summary: dict = {}
    print(
        f"{'env':<12} {'seed':>4} {'system':<8} {'solve s':>8} {'solve steps':>11} {'total s':>8} {'eval':>8}"
    )
    for env_id in args.envs:
        rows: dict[str, list[dict]] = {"sb3": [], "schedrl": []}
        for seed in range(args.seeds):
            for system in ("sb3", "schedrl"):
                r = spawn(system, env_id, seed, args.budget)
                rows[system].append(r)
                s_s = f"{r['solved_at_s']:.1f}" if "solved_at_s" in r else "-"
                s_n = str(r.get("solved_at_steps", "-"))
                print(
                    f"{env_id:<12} {seed:>4} {system:<8} {s_s:>8} {s_n:>11} {r['seconds']:>8.1f} {r['eval_return']:>8.1f}",
                    flush=True,
                )
        key = env_id.split("-")[0].lower()
        med = {}
        for system, rs in rows.items():
            times = [r.get("solved_at_s", float("inf")) for r in rs]
            steps = [r.get("solved_at_steps", float("inf")) for r in rs]
            med[system] = {
                "solve_s": statistics.median(times),
                "solve_steps": statistics.median(steps),
                "solved": sum("solved_at_s" in r for r in rs),
                "eval_return": statistics.mean(r["eval_return"] for r in rs),
            }
        summary[f"{key}_vs_sb3_time"] = round(med["sb3"]["solve_s"] / med["schedrl"]["solve_s"], 3)
        summary[f"{key}_vs_sb3_steps"] = round(med["schedrl"]["solve_steps"] / med["sb3"]["solve_steps"], 3)
        summary[key] = {
            s: {k: round(v, 2) if isinstance(v, float) else v for k, v in m.items()} for s, m in med.items()
        }
        print(
            f"{env_id}: median time to solve sb3 {med['sb3']['solve_s']:.1f} s, schedrl {med['schedrl']['solve_s']:.1f} s "
            f"-> {summary[f'{key}_vs_sb3_time']:.2f}x; steps ratio (schedrl/sb3) {summary[f'{key}_vs_sb3_steps']:.2f}; "
            f"eval sb3 {med['sb3']['eval_return']:.1f}, schedrl {med['schedrl']['eval_return']:.1f}"
        )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
