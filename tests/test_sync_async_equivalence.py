"""At k = 0 the asynchronous pipeline trains exactly the synchronous loop, for every kind of loss.

Both loops build their learner with one factory (`schedrl.orchestrate.build.make_learner`);
a loss whose normaliser is a constant (Dr. GRPO divides by rows x max_new_tokens), one with
a value head (PPO) and one over whole sequences (GSPO) must give the same losses step by
step in both.
"""

from __future__ import annotations

import pytest

from schedrl.config import config_from_dict
from schedrl.orchestrate.run import train
from schedrl.training.run_dir import RunDir, read_metrics

BASE = {
    "task": {"name": "sort", "args": {"min_len": 2, "max_len": 3}},
    "sft": {"steps": 30, "batch_size": 32, "lr": 1e-3},
    "sampling": {"prompts_per_step": 6, "group_size": 4, "max_new_tokens": 12, "temperature": 1.2},
    "eval": {"tasks": 4, "k": 2},
    "min_start_reward": 0.0,
    "steps": 3,
    "save_every": 0,
}
ALGOS = {
    "drgrpo": {"loss": "drgrpo", "advantage": "grpo", "std_normalize": False},
    "ppo": {"loss": "ppo", "advantage": "reward"},
    "gspo": {"loss": "gspo"},
}
# multi-turn episodes with a calculator tool and per-turn credit: the same samples, losses and steps
TOOLS = {
    "task": {
        "name": "calc",
        "args": {"min_digits": 2, "max_digits": 2},
        "env": "tools",
        "env_args": {"tools": ["schedrl.envs.calc:calc"]},
        "max_turns": 3,
    },
    "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 24, "temperature": 1.0},
}


@pytest.mark.train
def test_async_k0_trains_the_synchronous_run_with_tools(tmp_path):
    rows = {}
    for mode, pipeline in [("sync", {}), ("async", {"mode": "async", "backend": "local"})]:
        algo = {"turn_credit": "return_to_go", "turn_discount": 0.8}
        cfg = config_from_dict(
            {**BASE, **TOOLS, "algo": algo, "pipeline": pipeline, "out_dir": str(tmp_path), "name": mode}
        )
        run = RunDir.create(cfg.out_dir, cfg.name)
        train(cfg, run)
        rows[mode] = [r for r in read_metrics(run.metrics_path) if "reward_mean" in r]
    assert [r["step"] for r in rows["async"]] == [1, 2, 3]
    for a, b in zip(rows["sync"], rows["async"], strict=True):
        assert a["turns_mean"] == b["turns_mean"] >= 1
        assert a["reward_mean"] == b["reward_mean"] and a["gen_tokens"] == b["gen_tokens"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-7)


@pytest.mark.train
@pytest.mark.parametrize("algo", list(ALGOS))
def test_async_k0_trains_the_synchronous_run(tmp_path, algo):
    rows = {}
    for mode, pipeline in [("sync", {}), ("async", {"mode": "async", "backend": "local"})]:
        cfg = config_from_dict(
            {**BASE, "algo": ALGOS[algo], "pipeline": pipeline, "out_dir": str(tmp_path), "name": mode}
        )
        run = RunDir.create(cfg.out_dir, cfg.name)
        train(cfg, run)
        rows[mode] = [r for r in read_metrics(run.metrics_path) if "reward_mean" in r]
    sync, asyn = rows["sync"], rows["async"]
    assert [r["step"] for r in asyn] == [1, 2, 3]
    # steps where no sample reached the budget: a learner that divided by the longest sample would differ
    assert any(r["truncated_frac"] == 0 for r in sync)
    for a, b in zip(sync, asyn, strict=True):
        assert a["reward_mean"] == b["reward_mean"] and a["gen_tokens"] == b["gen_tokens"]
        for key in ("loss", "grad_norm", *(k for k in a if k.startswith(("vf_", "value")))):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), (a["step"], key)
