"""`VLLMEngine`'s own edges: its settings, what it refuses, and training runs on it (sync, threads, Ray).

The contract itself (greedy against `transformers.generate`, log-probs, abort/resume, weight swaps,
seeds, stops, ordering) runs on both engines in `test_engine_backends.py`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from schedrl.api import resolve_config
from schedrl.config import ConfigError, config_from_dict
from schedrl.engine import EngineConfig
from schedrl.orchestrate.run import train
from schedrl.training.run_dir import RunDir, read_metrics

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="needs the vllm extra (.ci/run runs it in .venv-vllm)")
SMALL_KV = {"kv_cache_memory_bytes": 64 << 20}


def test_config_refuses_vllm_settings_it_cannot_honour():
    with pytest.raises(
        ConfigError, match=r"'engine.vllm.max_num_seqs' is set by schedrl \(engine.max_concurrency\)"
    ):
        resolve_config({"engine": {"backend": "vllm", "vllm": {"max_num_seqs": 4}}})
    with pytest.raises(ConfigError, match="engine.vllm.*is set but engine.backend is 'builtin'"):
        resolve_config({"engine": {"vllm": {"enforce_eager": True}}})
    with pytest.raises(
        ConfigError, match="engine.backend': unknown engine backend 'sglang'; valid: builtin, vllm"
    ):
        resolve_config({"engine": {"backend": "sglang"}})
    with pytest.raises(
        ConfigError,
        match="'engine.park_slots': engine backend 'vllm' has no parking slots .*it parks in its own KV cache",
    ):
        resolve_config({"engine": {"backend": "vllm", "park_slots": 4}})


@pytest.mark.skipif(HAS_VLLM, reason="checks the message shown without vllm")
def test_missing_vllm_names_the_extra(model, tokenizer):
    from schedrl.engine.vllm_engine import VLLMEngine

    with pytest.raises(ImportError, match=r"pip install 'schedrl\[vllm\]'"):
        VLLMEngine(model, tokenizer)


@needs_vllm
def test_unknown_vllm_setting_is_named():
    with pytest.raises(ConfigError, match="'engine.vllm.enforce_eagre' is not a vLLM EngineArgs setting"):
        resolve_config({"engine": {"backend": "vllm", "vllm": {"enforce_eagre": True}}})


@needs_vllm
def test_a_model_vllm_cannot_load_is_named_with_its_path(tmp_path, model, tokenizer):
    from schedrl.engine.vllm_engine import VLLMEngine

    model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "architectures": ["NoSuchForCausalLM"]}))
    with pytest.raises(RuntimeError, match=f"vLLM could not load the model at {tmp_path}"):
        VLLMEngine(tmp_path, tokenizer, vllm_args=SMALL_KV)
    with pytest.raises(FileNotFoundError, match="no .*safetensors weights in"):
        VLLMEngine(tmp_path / "missing", tokenizer)


@needs_vllm
def test_a_weight_dict_that_does_not_match_names_the_first_bad_key(model, tokenizer):
    from schedrl.engine.vllm_engine import VLLMEngine

    engine = VLLMEngine(model, tokenizer, EngineConfig(max_concurrency=2), vllm_args=SMALL_KV)
    try:
        state = model.state_dict()
        with pytest.raises(ValueError, match="unexpected parameter 'model.layers.9.mlp.up_proj.weight'"):
            engine.update_weights({**state, "model.layers.9.mlp.up_proj.weight": torch.zeros(1)}, version=1)
        partial = {k: v for k, v in state.items() if k != "model.norm.weight"}
        with pytest.raises(ValueError, match="parameter 'model.norm.weight' .* is missing"):
            engine.update_weights(partial, version=1)
        assert engine.version == 0  # a refused update changes nothing
    finally:
        engine.close()


REVERSE = {
    "task": {"name": "reverse", "args": {"min_len": 2, "max_len": 3}},
    "sampling": {"prompts_per_step": 16, "group_size": 8, "max_new_tokens": 4},
    "sft": {"steps": 45},
    "optim": {"lr": 3e-4},
    "eval": {"tasks": 16, "k": 2},
    "engine": {"backend": "vllm", "vllm": SMALL_KV},
}


@needs_vllm
def test_sync_training_on_vllm_learns(tmp_path):
    """The sync loop pushes each update into vLLM: held-out pass@1 rises as it does on the built-in engine."""
    cfg = config_from_dict({**REVERSE, "steps": 60, "save_every": 0})
    result = train(cfg, RunDir.create(tmp_path, "rise"))
    rows = [r for r in read_metrics(tmp_path / "rise" / "metrics.jsonl") if "reward_mean" in r]
    first, last = (sum(r["reward_mean"] for r in rows[a:b]) / 15 for a, b in ((0, 15), (-15, None)))
    assert last > first + 0.1, (first, last)
    assert result["eval_after"]["pass@1"] > result["eval_before"]["pass@1"]


ASYNC = {
    "task": {"name": "sort", "args": {"min_len": 2, "max_len": 3}},
    "sft": {"steps": 20, "batch_size": 32, "lr": 1e-3},
    "sampling": {"prompts_per_step": 6, "group_size": 4, "max_new_tokens": 4, "temperature": 1.2},
    "algo": {"loss_args": {"clip_eps_high": 0.28}, "correction": "decoupled"},
    "eval": {"tasks": 8, "k": 2},
    "min_start_reward": 0.0,
    "engine": {"backend": "vllm", "vllm": SMALL_KV},
    "save_every": 0,
}


@needs_vllm
@pytest.mark.parametrize(
    ("backend", "schedule"),
    [
        ("threads", {"max_staleness": 2, "weight_sync": "inflight"}),
        ("local", {"max_staleness": 1, "consumption": "partial", "weight_sync": "cut_resume"}),
    ],
    ids=["threads-inflight", "partial-cut-resume"],
)
def test_async_pipeline_on_vllm(tmp_path, backend, schedule):
    pipeline = {"mode": "async", "backend": backend}
    cfg = config_from_dict({**ASYNC, "steps": 5, "pipeline": pipeline, "schedule": schedule})
    run = RunDir.create(tmp_path, "async")
    result = train(cfg, run)
    rows = [r for r in read_metrics(run.metrics_path) if "reward_mean" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert max(r["staleness_max"] for r in rows) <= schedule["max_staleness"]
    assert max(r["staleness_max"] for r in rows) >= 1  # the engine really ran ahead of the learner
    assert "greedy_acc" in result["eval_after"]


@needs_vllm
def test_ray_pipeline_on_vllm(tmp_path, monkeypatch):
    pytest.importorskip("ray")
    import ray

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    pipeline, schedule = {"mode": "async", "backend": "ray"}, {"max_staleness": 1, "weight_sync": "inflight"}
    cfg = config_from_dict({**ASYNC, "steps": 4, "pipeline": pipeline, "schedule": schedule})
    run = RunDir.create(tmp_path, "ray")
    train(cfg, run)
    rows = [r for r in read_metrics(run.metrics_path) if "reward_mean" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert not ray.is_initialized()


@needs_vllm
def test_the_vllm_recipe_runs_through_the_command_line(tmp_path):
    recipe = Path(__file__).resolve().parents[1] / "examples" / "vllm_engine.yaml"
    sets = ["steps=3", "save_every=0", "sft.steps=2", "eval.tasks=4", "eval.k=2", "min_start_reward=0"]
    sets += [f"out_dir={tmp_path}", "name=run"]
    cmd = [
        sys.executable,
        "-m",
        "schedrl.cli",
        "train",
        str(recipe),
        *(x for s in sets for x in ("--set", s)),
    ]
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 3
    rows = [r for r in read_metrics(Path(summary["run_dir"]) / "metrics.jsonl") if "reward_mean" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]


@needs_vllm
def test_multi_turn_episodes_on_vllm_equal_the_builtin_engines(model, tokenizer):
    """A tool answer between turns, greedy turns: the same trajectories, token for token, on both engines
    (the built-in engine's equal `transformers.generate`, test_engine.py)."""
    from test_episodes import OneCall

    from schedrl.engine import HFEngine
    from schedrl.engine.vllm_engine import VLLMEngine
    from schedrl.envs import make_task
    from schedrl.rollout.episodes import EpisodeRunner
    from schedrl.types import Request, SamplingParams

    tasks = make_task("addition").sample("train", 4, seed=0)
    reqs = [
        Request(
            f"e{i}", tuple(tokenizer(t.prompt).input_ids), SamplingParams(40, temperature=0), task_id=t.id
        )
        for i, t in enumerate(tasks)
    ]
    out = {}
    for name, engine in (
        ("builtin", HFEngine(model, tokenizer, EngineConfig(max_concurrency=4))),
        ("vllm", VLLMEngine(model, tokenizer, EngineConfig(max_concurrency=4), vllm_args=SMALL_KV)),
    ):
        runner = EpisodeRunner(engine, tokenizer, lambda: OneCall(), max_turns=3)
        try:
            out[name] = runner.run(reqs, {t.id: t for t in tasks})
            assert runner.last_turns == [2, 2, 2, 2]
        finally:
            runner.close()
            if isinstance(engine, VLLMEngine):
                engine.close()
    for a, b in zip(out["builtin"], out["vllm"], strict=True):
        assert a.token_ids == b.token_ids and a.trained == b.trained and a.reward == b.reward
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=5e-5, rtol=0)
