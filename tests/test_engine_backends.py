"""The engine contract on both engines: the built-in `HFEngine` and `VLLMEngine` (where vLLM is installed).

Each check compares an engine with an independent reference (`transformers.generate`, a plain
forward pass, an uninterrupted run) rather than with the other engine, so either engine
failing is caught on its own. The vLLM rows skip without the `vllm` package; `.ci/run` runs
them in `.venv-vllm`.

Log-prob tolerance: 1e-5 for the built-in engine (its kernels are the reference model's), 5e-5
for vLLM (its own CPU attention and matmul kernels, float32).

`SCHEDRL_TEST_DEVICE=cuda` runs every check with the models (the references' too) on the GPU
(`bench/gpu_check.sh`); the tolerances are then 1e-4, for TF32-free float32 GPU kernels.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
from test_engine import GREEDY, PROMPTS, forward_logprobs, hf_greedy, make_requests

from schedrl.engine import EngineConfig, HFEngine, Priority
from schedrl.rollout.registry import make_admission
from schedrl.types import Request, SamplingParams

BACKENDS = ["builtin", "vllm"]
DEVICE = torch.device(os.environ.get("SCHEDRL_TEST_DEVICE", "cpu"))
TOLERANCE = {"builtin": 1e-5, "vllm": 5e-5} if DEVICE.type == "cpu" else {"builtin": 1e-4, "vllm": 1e-4}
SMALL_KV = {"kv_cache_memory_bytes": 64 << 20}  # a few thousand tokens: plenty for these checks


def _on_device(m):
    return m if DEVICE.type == "cpu" else copy.deepcopy(m).to(DEVICE)


@pytest.fixture
def model(model):
    return _on_device(model)


@pytest.fixture
def other_model(other_model):
    return _on_device(other_model)


@pytest.fixture
def default_model(default_model):
    return _on_device(default_model)


@pytest.fixture
def build(request):
    """`build(model, tokenizer, config=None, admission=None)` for the backend of the test's `backend`."""
    backend = request.getfixturevalue("backend")
    made = []
    if backend == "vllm":
        pytest.importorskip("vllm")
        from schedrl.engine.vllm_engine import VLLMEngine

    def make(model, tokenizer, config=None, admission=None):
        if backend == "builtin":
            return HFEngine(model, tokenizer, config, admission=admission)
        engine = VLLMEngine(model, tokenizer, config, admission=admission, vllm_args=SMALL_KV)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.close()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "config",
    [EngineConfig(max_concurrency=3), EngineConfig(max_concurrency=8, max_batched_tokens=40)],
    ids=["continuous", "token-capped"],
)
def test_greedy_equals_transformers_generate(build, backend, model, tokenizer, config):
    refs = hf_greedy(model, tokenizer, PROMPTS, GREEDY.max_new_tokens)
    assert len({len(r) for r in refs}) > 1  # requests leave the batch at different steps
    samples = build(model, tokenizer, config).generate(make_requests(tokenizer, GREEDY))
    assert [s.token_ids for s in samples] == refs
    for s, ref in zip(samples, refs, strict=True):
        assert s.finish_reason == ("stop" if ref[-1] == tokenizer.eos_token_id else "length")
        assert s.versions == (0,) * len(ref)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_a_separate_forward(build, backend, default_model, tokenizer, temperature):
    params = SamplingParams(max_new_tokens=20, temperature=temperature, seed=3)
    engine = build(default_model, tokenizer, EngineConfig(max_concurrency=3))
    for s in engine.generate(make_requests(tokenizer, params)):
        ref = forward_logprobs(default_model, s.prompt_ids, s.token_ids, temperature)
        torch.testing.assert_close(torch.tensor(s.logprobs), ref, atol=TOLERANCE[backend], rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_abort_then_resume_equals_an_uninterrupted_greedy_run(build, backend, model, tokenizer):
    reqs = make_requests(tokenizer, GREEDY)
    full = hf_greedy(model, tokenizer, PROMPTS, GREEDY.max_new_tokens)
    engine = build(model, tokenizer, EngineConfig(max_concurrency=4))
    for r in reqs:
        engine.add(r)
    done = {}
    for _ in range(3):
        done.update((s.request_id, s) for s in engine.step())
    longest = max(engine.running_ids, key=lambda rid: len(full[int(rid[1:])]))
    i, j = int(longest[1:]), int(engine.waiting_ids[-1][1:])
    cut = engine.abort(longest)
    waiting = engine.abort(f"r{j}")
    assert cut.finish_reason == "aborted" and 0 < cut.num_tokens < len(full[i])
    assert waiting.finish_reason == "aborted" and waiting.num_tokens == 0
    assert cut.token_ids == full[i][: cut.num_tokens]
    with pytest.raises(KeyError, match="neither waiting nor running"):
        engine.abort(longest)
    engine.add(Request.resume(cut))
    engine.add(Request.resume(waiting))
    while engine.has_unfinished():
        done.update((s.request_id, s) for s in engine.step())
    assert sorted(done) == sorted(r.id for r in reqs)
    for k in range(len(reqs)):
        assert done[f"r{k}"].token_ids == full[k]
        assert done[f"r{k}"].num_tokens <= GREEDY.max_new_tokens  # within the original budget
    assert done[f"r{i}"].logprobs[: cut.num_tokens] == cut.logprobs  # the prefix's behaviour log-probs kept


@pytest.mark.parametrize("backend", BACKENDS)
def test_weight_swap_retags_from_that_step_and_new_tokens_follow_the_new_weights(
    build, backend, model, other_model, tokenizer
):
    params = SamplingParams(max_new_tokens=16, temperature=0, ignore_eos=True)
    reqs = make_requests(tokenizer, params)[:4]
    base = {r.id: t for r, t in zip(reqs, forward_greedy(model, tokenizer, PROMPTS[:4], 16), strict=True)}
    engine = build(model, tokenizer, EngineConfig(max_concurrency=4))
    for r in reqs:
        engine.add(r)
    for _ in range(6):
        engine.step()
    engine.update_weights(other_model.state_dict(), version=1)
    assert engine.version == 1
    swapped = {}
    while engine.has_unfinished():
        swapped.update((s.request_id, s) for s in engine.step())
    for rid, ref in base.items():
        assert swapped[rid].versions == (0,) * 6 + (1,) * 10
        assert swapped[rid].token_ids[:6] == ref[:6]
    assert any(swapped[rid].token_ids[6:] != ref[6:] for rid, ref in base.items())
    # The same prompts admitted after the swap decode exactly as the new weights do: nothing computed
    # by the old weights (a prefix cache entry included) leaks into them.
    after = engine.generate(make_requests(tokenizer, params, PROMPTS[:4], tag="after"))
    assert [s.token_ids for s in after] == forward_greedy(other_model, tokenizer, PROMPTS[:4], 16)
    assert all(s.versions == (1,) * 16 for s in after)


@pytest.mark.parametrize("backend", BACKENDS)
def test_seeded_sampling_is_reproducible(build, backend, model, tokenizer):
    def reqs(seed_of):
        return [
            Request(
                f"r{i}", tuple(tokenizer(p).input_ids), SamplingParams(20, temperature=1.0, seed=seed_of(i))
            )
            for i, p in enumerate(PROMPTS)
        ]

    a = build(model, tokenizer, EngineConfig(max_concurrency=8)).generate(reqs(lambda i: i))
    b = build(model, tokenizer, EngineConfig(max_concurrency=2)).generate(reqs(lambda i: i))
    c = build(model, tokenizer, EngineConfig(max_concurrency=8)).generate(reqs(lambda i: 100 + i))
    assert [s.token_ids for s in a] == [s.token_ids for s in b]
    assert [s.token_ids for s in c] != [s.token_ids for s in a]


@pytest.mark.parametrize("backend", BACKENDS)
def test_stop_strings_and_stop_tokens_end_at_the_completing_token(build, backend, model, tokenizer):
    params = SamplingParams(max_new_tokens=24, temperature=0, ignore_eos=True)
    engine = build(model, tokenizer)
    [full] = engine.generate(make_requests(tokenizer, params, ["cd:3,5,7>22="], tag="full"))
    assert full.finish_reason == "length" and full.num_tokens == 24
    text = tokenizer.decode(full.token_ids, skip_special_tokens=True)
    stop = text[5:7]
    end = next(
        k
        for k in range(1, full.num_tokens + 1)
        if stop in tokenizer.decode(full.token_ids[:k], skip_special_tokens=True)
    )
    assert end < full.num_tokens
    by_string = SamplingParams(**{**params.__dict__, "stop_strings": (stop,)})
    [s] = engine.generate(make_requests(tokenizer, by_string, ["cd:3,5,7>22="], tag="str"))
    assert s.finish_reason == "stop" and s.token_ids == full.token_ids[:end]
    assert s.text.endswith(stop) and s.text.count(stop) == 1
    stop_tok = full.token_ids[4]
    by_token = SamplingParams(**{**params.__dict__, "stop_token_ids": (stop_tok,)})
    [t] = engine.generate(make_requests(tokenizer, by_token, ["cd:3,5,7>22="], tag="tok"))
    assert t.finish_reason == "stop"
    assert t.token_ids == full.token_ids[: full.token_ids.index(stop_tok) + 1]


def forward_greedy(model, tokenizer, prompts, n) -> list[tuple[int, ...]]:
    """Reference greedy decoding through eos: n full forward passes, no cache."""
    refs = []
    for p in prompts:
        ids = list(tokenizer(p).input_ids)
        start = len(ids)
        with torch.no_grad():
            for _ in range(n):
                ids.append(int(model(torch.tensor([ids], device=model.device)).logits[0, -1].argmax()))
        refs.append(tuple(ids[start:]))
    return refs


def _finish_order(engine, requests) -> list[str]:
    order: list[str] = []
    chained = engine.on_finish  # an admission policy that follows the engine chains onto it

    def on_finish(sample):
        order.append(sample.request_id)
        if chained is not None:
            chained(sample)

    engine.on_finish = on_finish
    for r in requests:
        engine.add(r)
    while engine.has_unfinished():
        engine.step()
    return order


@pytest.mark.parametrize("backend", BACKENDS)
def test_ordering_policies_change_the_admission_order(build, backend, model, tokenizer):
    params = SamplingParams(max_new_tokens=2, temperature=0, ignore_eos=True)
    reqs = [Request(f"p{i}", (5, 6, 7), params, priority=p) for i, p in enumerate([0.0, 5.0, 1.0])]
    one = EngineConfig(max_concurrency=1)
    assert _finish_order(build(model, tokenizer, one), reqs) == ["p0", "p1", "p2"]
    assert _finish_order(build(model, tokenizer, one, Priority()), reqs) == ["p1", "p2", "p0"]
    # Longest-predicted-first: the sibling predictor has seen group g's samples run long, h's short.
    lpt = make_admission("lpt", predictor="sibling")
    engine = build(model, tokenizer, EngineConfig(max_concurrency=1), lpt)
    seen = [
        Request("g-a", (5, 6, 7), SamplingParams(12, temperature=0, ignore_eos=True), group_id="g"),
        Request("h-a", (5, 6, 8), SamplingParams(2, temperature=0, ignore_eos=True), group_id="h"),
    ]
    assert _finish_order(engine, seen) == ["g-a", "h-a"]
    later = [
        Request("h-b", (5, 6, 8), SamplingParams(12, temperature=0, ignore_eos=True), group_id="h"),
        Request("g-b", (5, 6, 7), SamplingParams(12, temperature=0, ignore_eos=True), group_id="g"),
    ]
    assert _finish_order(engine, later) == ["g-b", "h-b"]  # FCFS would run h-b first
