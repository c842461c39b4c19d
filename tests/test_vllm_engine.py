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


@needs_vllm
def test_a_push_to_vllm_is_checked_bucket_by_bucket_and_by_the_probe(model, other_model, tokenizer):
    """vLLM takes a push in buckets (a decoder layer each, reloaded in place), then reproduces the learner's
    log-probs of the probe within 1e-4 while it generates; a stale bucket, and a push vLLM drops without
    loading it (as under sleep mode, trl#5312), each fail naming the version."""
    from schedrl.engine.vllm_engine import VLLMEngine
    from schedrl.engine.weight_push import WeightPushError, push_of, receive
    from schedrl.types import Request, SamplingParams

    engine = VLLMEngine(model, tokenizer, EngineConfig(max_concurrency=2), vllm_args=SMALL_KV)
    try:
        params = SamplingParams(max_new_tokens=12, temperature=0.0)
        for i in range(3):  # more than max_concurrency: the probe runs beside a full batch
            engine.add(Request(f"r{i}", tuple(tokenizer.encode("abc" * (i + 1))), params))
        engine.step()
        receive(engine, push_of(other_model, 1, tol=1e-4), 1)  # every bucket reloaded: the probe passes
        assert engine.version == 1 and len(engine.running_ids) == 2
        samples = []
        while engine.has_unfinished():
            samples += engine.step()
        assert sorted(s.request_id for s in samples) == ["r0", "r1", "r2"]  # nothing lost to the probe
        assert all(s.versions[-1] == 1 for s in samples)
        stale = push_of(model, 2)
        layer = stale.buckets[1]
        layer.weights = {
            n: other_model.state_dict()[n] for n in layer.weights
        }  # version 1's, checksums of 2's
        with pytest.raises(WeightPushError, match=r"version 2: bucket 'layers.0' holds other weights"):
            receive(engine, stale, 2)
        engine.update_bucket = lambda weights, check=True: (
            stale.buckets[0].sum
            if "model.norm.weight" in weights
            else next(b.sum for b in stale.buckets if set(b.weights) == set(weights))
        )  # reports every bucket loaded, loads none
        with pytest.raises(WeightPushError, match=r"version 3: the engine continues probe 0 with token"):
            receive(engine, push_of(model, 3), 3)
    finally:
        engine.close()


def _lora_push(peft_model, version):
    """The push a LoRA learner makes: the adapters and a probe from the adapted model."""
    from schedrl.engine.weight_push import WeightPush, make_probe
    from schedrl.training.lora import adapter_weights

    probe = make_probe(peft_model.config.vocab_size, peft_model, 1e-4)
    return WeightPush(version, adapters=adapter_weights(peft_model), probe=probe)


@needs_vllm
def test_lora_versions_on_vllm_are_lora_requests_and_base_requests_stay_exact(model, tokenizer):
    """Version 0 runs through an adapter whose B is zero, so batched beside requests under a trained
    adapter it still equals the base model (vLLM's CPU path applies the last adapter to a request without
    one); each version after a push is a new LoRARequest, which reproduces peft's log-probs (the probe);
    a request finishes under the version it was admitted under; old versions leave vLLM's cache."""
    import copy

    from schedrl.engine.vllm_engine import VLLMEngine
    from schedrl.engine.weight_push import next_token_logprobs, receive
    from schedrl.training.lora import apply_lora, lora_spec
    from schedrl.types import Request, SamplingParams

    spec = lora_spec({"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj", "down_proj"]})
    peft_model = apply_lora(copy.deepcopy(model), spec)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)  # a trained adapter: far from the base
    engine = VLLMEngine(
        model, tokenizer, EngineConfig(max_concurrency=4), vllm_args=SMALL_KV, lora=spec, lora_keep=1
    )
    try:
        greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
        prompts = [tuple(tokenizer.encode(t)) for t in ("abcab", "hello", "xyzzy", "sort me")]
        engine.add(Request("base0", prompts[0], greedy))
        engine.add(Request("base1", prompts[1], greedy))
        engine.step()  # both admitted under version 0
        receive(engine, _lora_push(peft_model, 1), 1)  # the probe passes within 1e-4
        assert engine.version == 1 and set(engine._lora.held) == {0, 1}
        engine.add(Request("new0", prompts[2], greedy))
        engine.add(Request("new1", prompts[3], greedy))
        out = {}
        while engine.has_unfinished():
            out.update({s.request_id: s for s in engine.step()})
        assert set(out["base0"].versions) == {0} and set(out["new0"].versions) == {1}
        peft_model.eval()
        for rid, prompt, reference in [
            ("base0", prompts[0], model), ("base1", prompts[1], model),
            ("new0", prompts[2], peft_model), ("new1", prompts[3], peft_model),
        ]:  # fmt: skip
            s = out[rid]
            ids = torch.tensor([[*prompt, *s.token_ids]])
            want = next_token_logprobs(reference, ids)[0, len(prompt) - 1 :]
            assert torch.allclose(torch.tensor(s.logprobs), want, atol=2e-4), rid
        receive(engine, _lora_push(peft_model, 2), 2)
        assert set(engine._lora.held) == {2}  # versions 0 and 1: no request uses them, not the newest
        assert engine.llm.list_loras() == {3}
    finally:
        engine.close()


@needs_vllm
def test_a_lora_run_on_vllm_pushes_adapters_as_lora_requests(tmp_path):
    """LoRA training with vLLM engines: each update reaches the engines as a new LoRARequest and passes the
    probe (a push vLLM did not apply would stop the run); a sample's tokens carry the version of the
    adapter it ran under, within the staleness bound."""
    pytest.importorskip("peft")
    pipeline = {"mode": "async", "backend": "threads"}
    schedule = {"max_staleness": 1, "weight_sync": "inflight"}
    cfg = config_from_dict(
        {
            **ASYNC,
            "steps": 4,
            "pipeline": pipeline,
            "schedule": schedule,
            "learner": {"lora": {"r": 8, "alpha": 16}},
        }
    )
    run = RunDir.create(tmp_path, "lora")
    train(cfg, run)
    rows = [r for r in read_metrics(run.metrics_path) if "reward_mean" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert max(r["staleness_max"] for r in rows) <= 1
    assert (
        max(r["staleness_max"] for r in rows) >= 1
    )  # requests ran under an older adapter than the learner's
