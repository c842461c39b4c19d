"""LoRA adapters (peft): only the adapters train; the engines receive the adapters alone and merge them as
peft does; a run checkpoints the adapters and resumes exactly; bad settings name the field."""

from __future__ import annotations

import copy

import pytest
import torch
from safetensors.torch import load_file

import schedrl
from schedrl.config import AlgoConfig, ConfigError, OptimConfig
from schedrl.engine import EngineConfig, HFEngine
from schedrl.training.learner import Learner
from schedrl.training.lora import adapter_weights, apply_lora, lora_spec, merged_state_dict
from schedrl.training.run_dir import read_metrics
from schedrl.types import Request, SamplingParams

SPEC = lora_spec({"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj", "down_proj"]})


def _trained_adapter(model):
    """A peft-wrapped copy of `model` whose B matrices are not zero (a trained adapter)."""
    peft_model = apply_lora(copy.deepcopy(model), SPEC)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return peft_model


def test_the_merge_is_peft_merge_and_unload_exactly(default_model):
    peft_model = _trained_adapter(default_model)
    ours = merged_state_dict(peft_model)
    theirs = copy.deepcopy(peft_model).merge_and_unload().state_dict()  # pyright: ignore[reportCallIssue]
    assert ours.keys() == theirs.keys()
    for k, v in theirs.items():
        assert torch.equal(ours[k], v), k
    adapters = adapter_weights(peft_model)
    assert len(adapters.layers) == 3 * default_model.config.num_hidden_layers
    full = sum(p.numel() for p in default_model.parameters())
    assert adapters.numel < 0.2 * full  # what an adapter push carries


def test_an_engine_given_the_adapters_generates_from_the_trained_policy(default_model, tokenizer):
    peft_model = _trained_adapter(default_model)
    merged = copy.deepcopy(peft_model).merge_and_unload()  # pyright: ignore[reportCallIssue]
    prompt = tokenizer("3+4=")["input_ids"]
    requests = [
        Request(f"r{i}", tuple(prompt), SamplingParams(6, temperature=0.0, ignore_eos=True)) for i in range(2)
    ]

    def run(engine):
        for r in requests:
            engine.add(r)
        out = {}
        while engine.has_unfinished():
            out |= {s.request_id: s for s in engine.step()}
        return out

    pushed = HFEngine(default_model, tokenizer, EngineConfig())
    pushed.update_weights(adapter_weights(peft_model), version=1)
    pushed.update_weights(
        adapter_weights(peft_model), version=2
    )  # again: merged into the kept base, not onto itself
    reference = HFEngine(merged, tokenizer, EngineConfig())
    a, b = run(pushed), run(reference)
    base = run(HFEngine(default_model, tokenizer, EngineConfig()))
    for rid in a:
        assert a[rid].token_ids == b[rid].token_ids
        assert a[rid].logprobs == pytest.approx(b[rid].logprobs, abs=1e-6)
    assert any(
        a[r].logprobs != pytest.approx(base[r].logprobs, abs=1e-3) for r in a
    )  # the adapters did change it


def test_only_the_adapters_train(default_model):
    from test_learner import make_batch

    model = copy.deepcopy(default_model)
    learner = Learner(model, OptimConfig(lr=1e-2), AlgoConfig(), total_steps=2, lora=SPEC)
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    batch, adv = make_batch()
    learner.update(batch, adv, 0)
    after = learner.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all("lora_" in k for k in changed)
    assert {id(p) for g in learner.optimizer.param_groups for p in g["params"]} == {
        id(p) for n, p in learner.model.named_parameters() if "lora_" in n
    }


BASE = {
    "steps": 4,
    "save_every": 2,
    "keep_last": None,
    "task": {"name": "addition", "args": {"min_digits": 1, "max_digits": 1}},
    "sft": {"steps": 60, "batch_size": 32, "lr": 1e-3},
    "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4, "temperature": 1.2},
    "optim": {"lr": 5e-3},
    "eval": {"tasks": 0},
    "min_start_reward": 0.0,
    "pipeline": {"mode": "async", "backend": "local"},
    "learner": {"lora": {"r": 4, "alpha": 8}},
    "logging": {"backends": ["jsonl"]},
}


@pytest.mark.train
def test_a_lora_run_checkpoints_the_adapters_and_resumes_exactly(tmp_path):
    import shutil

    schedrl.train({**BASE, "out_dir": str(tmp_path), "name": "whole"})
    whole = tmp_path / "whole"
    final = whole / "checkpoints" / "step_000004"
    adapter = load_file(final / "adapter" / "adapter_model.safetensors")
    assert adapter and all("lora_" in k for k in adapter)
    start = load_file(whole / "checkpoints" / "step_000000" / "model" / "model.safetensors")
    merged = load_file(final / "model" / "model.safetensors")
    assert merged.keys() == start.keys()  # the checkpoint's model is the plain (merged) policy
    assert any(not torch.equal(merged[k], start[k]) for k in merged if "q_proj" in k)
    assert all(torch.equal(merged[k], start[k]) for k in merged if "_proj" not in k)  # nothing else trained
    cut = tmp_path / "cut"
    shutil.copytree(whole, cut)
    shutil.rmtree(cut / "checkpoints" / "step_000004")
    (cut / "checkpoints" / "latest").write_text("step_000002")
    schedrl.train(resume=cut)
    again = load_file(cut / "checkpoints" / "step_000004" / "adapter" / "adapter_model.safetensors")
    for k, v in adapter.items():
        torch.testing.assert_close(again[k], v, atol=1e-6, rtol=0)
    rows = [r["reward_mean"] for r in read_metrics(whole / "metrics.jsonl") if "loss" in r]
    assert rows == [r["reward_mean"] for r in read_metrics(cut / "metrics.jsonl") if "loss" in r]


@pytest.mark.parametrize(
    "lora,extra,message",
    [
        ({"rank": 4}, {}, r"'learner.lora': unknown key\(s\) rank; known: r, alpha, dropout, target_modules"),
        ({"r": 0}, {}, r"'learner.lora': 'r' must be a positive integer, got 0"),
        (
            {"target_modules": ["qkv_proj"]},
            {},
            r"'qkv_proj' are not linear layers of LlamaForCausalLM; candidates: down_proj, gate_proj",
        ),
        (
            {},
            {"pipeline": {"mode": "sync"}},
            r"'learner.lora' trains adapters in the learner worker.*pipeline.mode 'async'",
        ),
    ],
)
def test_bad_lora_settings_name_the_field(tmp_path, lora, extra, message):
    cfg = {"out_dir": str(tmp_path), "pipeline": {"mode": "async"}, "learner": {"lora": lora}}
    for k, v in extra.items():
        cfg[k] = {**cfg.get(k, {}), **v}
    with pytest.raises(ConfigError, match=message):
        schedrl.train(cfg)
    assert not any(tmp_path.iterdir())  # refused before the run directory was written
