"""The built-in engine against `transformers.generate` and against plain forward passes."""

import pytest
import torch

from schedrl.engine import EngineConfig, HFEngine, Priority, StaticBatch
from schedrl.types import Request, SamplingParams

PROMPTS = ["12+34=", "sort:31415926=", "7", "rev:0123456789012345=", "cd:3,5,7>22=", "99+1=", "ab", "x" * 30]
GREEDY = SamplingParams(max_new_tokens=24, temperature=0)


def make_requests(tokenizer, params, prompts=PROMPTS, tag="r"):
    return [Request(f"{tag}{i}", tuple(tokenizer(p).input_ids), params) for i, p in enumerate(prompts)]


def hf_greedy(model, tokenizer, prompts, max_new_tokens):
    """Reference: HF generate, one left-padded static batch, cut after the first eos."""
    enc = tokenizer(prompts, return_tensors="pt", padding=True).to(model.device)
    out = model.generate(
        **enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
    )
    refs = []
    for row in out[:, enc.input_ids.shape[1] :].tolist():
        if tokenizer.eos_token_id in row:
            row = row[: row.index(tokenizer.eos_token_id) + 1]
        refs.append(tuple(row))
    return refs


@pytest.mark.parametrize(
    ("mode", "config", "admission"),
    [
        ("static", EngineConfig(max_concurrency=16), StaticBatch()),
        ("continuous", EngineConfig(max_concurrency=3), None),
        ("token-capped", EngineConfig(max_concurrency=8, max_batched_tokens=40), None),
        ("rows-alone", EngineConfig(max_concurrency=16, row_call_keys=0), None),
        ("row-major", EngineConfig(max_concurrency=16, input_major_weights=False), None),
    ],
)
def test_greedy_matches_transformers_generate(model, tokenizer, mode, config, admission):
    refs = hf_greedy(model, tokenizer, PROMPTS, GREEDY.max_new_tokens)
    assert len({len(r) for r in refs}) > 1  # mixed output lengths, so requests leave at different steps
    engine = HFEngine(model, tokenizer, config, admission=admission)
    samples = engine.generate(make_requests(tokenizer, GREEDY))
    assert [s.token_ids for s in samples] == refs
    for s, ref in zip(samples, refs, strict=True):
        assert s.finish_reason == ("stop" if ref[-1] == tokenizer.eos_token_id else "length")


def forward_logprobs(model, prompt_ids, token_ids, temperature=1.0):
    ids = torch.tensor([list(prompt_ids) + list(token_ids)], device=model.device)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float().cpu() / temperature
    return logits.log_softmax(-1).gather(-1, torch.tensor(token_ids)[:, None]).squeeze(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_a_separate_forward(default_model, tokenizer, temperature):
    params = SamplingParams(max_new_tokens=20, temperature=temperature, seed=3)
    engine = HFEngine(default_model, tokenizer, EngineConfig(max_concurrency=3))
    for s in engine.generate(make_requests(tokenizer, params)):
        ref = forward_logprobs(default_model, s.prompt_ids, s.token_ids, temperature)
        torch.testing.assert_close(torch.tensor(s.logprobs), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("params", [GREEDY, SamplingParams(max_new_tokens=24, temperature=1.0, seed=11)])
def test_abort_then_resume_continues_like_an_uninterrupted_run(model, tokenizer, params):
    reqs = make_requests(tokenizer, params)
    full = HFEngine(model, tokenizer, EngineConfig(max_concurrency=4)).generate(reqs)
    engine = HFEngine(model, tokenizer, EngineConfig(max_concurrency=4))
    for r in reqs:
        engine.add(r)
    done = {}
    for _ in range(3):
        done.update((s.request_id, s) for s in engine.step())
    longest = max(engine.running_ids, key=lambda rid: full[int(rid[1:])].num_tokens)
    i, j = int(longest[1:]), int(engine.waiting_ids[-1][1:])
    cut = engine.abort(longest)  # running, with more to generate
    waiting = engine.abort(f"r{j}")  # never admitted: nothing generated yet
    assert cut.finish_reason == "aborted" and 0 < cut.num_tokens < full[i].num_tokens
    assert waiting.finish_reason == "aborted" and waiting.num_tokens == 0
    assert cut.token_ids == full[i].token_ids[: cut.num_tokens]
    engine.add(Request.resume(cut))
    engine.add(Request.resume(waiting))
    while engine.has_unfinished():
        done.update((s.request_id, s) for s in engine.step())
    assert sorted(done) == sorted(r.id for r in reqs)
    for i in range(len(reqs)):
        assert done[f"r{i}"].token_ids == full[i].token_ids
        torch.testing.assert_close(
            torch.tensor(done[f"r{i}"].logprobs), torch.tensor(full[i].logprobs), atol=1e-5, rtol=0
        )
        assert (
            done[f"r{i}"].num_tokens <= params.max_new_tokens
        )  # the resumed sample keeps its original budget


def test_weight_swap_mid_generation_retags_from_that_step(model, other_model, tokenizer):
    params = SamplingParams(max_new_tokens=16, temperature=0, ignore_eos=True)
    reqs = make_requests(tokenizer, params)[:4]
    base = HFEngine(model, tokenizer, EngineConfig(max_concurrency=4)).generate(reqs)
    engine = HFEngine(model, tokenizer, EngineConfig(max_concurrency=4))
    for r in reqs:
        engine.add(r)
    for _ in range(6):
        engine.step()
    engine.update_weights(other_model.state_dict(), version=1)
    swapped = {}
    while engine.has_unfinished():
        swapped.update((s.request_id, s) for s in engine.step())
    for b in base:
        s = swapped[b.request_id]
        assert s.versions == (0,) * 6 + (1,) * 10
        assert s.token_ids[:6] == b.token_ids[:6]
    # The new weights really drive the tokens after the swap.
    assert any(swapped[b.request_id].token_ids[6:] != b.token_ids[6:] for b in base)
    with pytest.raises(ValueError, match="unknown parameter 'nope'"):
        engine.update_weights({"nope": torch.zeros(1)}, version=2)


def test_seeded_sampling_is_reproducible_across_batch_shapes(model, tokenizer):
    params = SamplingParams(max_new_tokens=20, temperature=1.0, top_p=0.9, top_k=20, seed=5)
    reqs = [
        Request(f"r{i}", tuple(tokenizer(p).input_ids), SamplingParams(**{**params.__dict__, "seed": i}))
        for i, p in enumerate(PROMPTS)
    ]
    a = HFEngine(model, tokenizer, EngineConfig(max_concurrency=8)).generate(reqs)
    b = HFEngine(model, tokenizer, EngineConfig(max_concurrency=2)).generate(reqs)
    assert [s.token_ids for s in a] == [s.token_ids for s in b]
    c = HFEngine(model, tokenizer, EngineConfig(max_concurrency=8, seed=1)).generate(
        [Request(r.id, r.prompt_ids, SamplingParams(max_new_tokens=20)) for r in reqs]
    )
    assert [s.token_ids for s in c] != [s.token_ids for s in a]


def test_sampling_follows_the_softmax(model, tokenizer):
    prompt = tuple(tokenizer("12+34=").input_ids)
    with torch.no_grad():
        probs = model(torch.tensor([prompt])).logits[0, -1].div(0.8).softmax(-1)
    n = 3000
    reqs = [
        Request(f"s{i}", prompt, SamplingParams(max_new_tokens=1, temperature=0.8, seed=i)) for i in range(n)
    ]
    samples = HFEngine(model, tokenizer, EngineConfig(max_concurrency=256)).generate(reqs)
    counts = torch.bincount(torch.tensor([s.token_ids[0] for s in samples]), minlength=len(probs)).float()
    total_variation = 0.5 * (counts / n - probs).abs().sum().item()
    assert total_variation < 0.06


def test_top_k_and_top_p_restrict_the_support(model, tokenizer):
    prompt = tuple(tokenizer("sort:31415926=").input_ids)
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1]
    order = logits.argsort(descending=True).tolist()
    probs = logits.softmax(-1)[order]
    nucleus = order[: int((probs.cumsum(0) - probs < 0.5).sum())]

    def first_tokens(**kw):
        reqs = [Request(f"k{i}", prompt, SamplingParams(max_new_tokens=1, seed=i, **kw)) for i in range(300)]
        return {
            s.token_ids[0]
            for s in HFEngine(model, tokenizer, EngineConfig(max_concurrency=64)).generate(reqs)
        }

    assert first_tokens(top_k=1) == {order[0]}
    assert first_tokens(top_k=3) == set(order[:3])
    assert first_tokens(top_p=0.5) == set(nucleus)


def test_stop_string_ends_output_at_the_completing_token(model, tokenizer):
    params = SamplingParams(max_new_tokens=24, temperature=0, ignore_eos=True)
    [full] = HFEngine(model, tokenizer).generate(make_requests(tokenizer, params, ["cd:3,5,7>22="]))
    text = tokenizer.decode(full.token_ids, skip_special_tokens=True)
    stop = text[5:7]
    # The first k whose decoded prefix contains the stop string.
    end = next(
        k
        for k in range(1, full.num_tokens + 1)
        if stop in tokenizer.decode(full.token_ids[:k], skip_special_tokens=True)
    )
    assert end < full.num_tokens
    engine = HFEngine(model, tokenizer)
    [s] = engine.generate(
        make_requests(
            tokenizer, SamplingParams(**{**params.__dict__, "stop_strings": (stop,)}), ["cd:3,5,7>22="]
        )
    )
    assert s.finish_reason == "stop"
    assert s.token_ids == full.token_ids[:end]
    assert s.text.endswith(stop) and s.text.count(stop) == 1


def test_stop_token_ids_and_length(model, tokenizer):
    params = SamplingParams(max_new_tokens=24, temperature=0, ignore_eos=True)
    [full] = HFEngine(model, tokenizer).generate(make_requests(tokenizer, params, ["x" * 30]))
    stop_tok = full.token_ids[4]
    first = full.token_ids.index(stop_tok)
    [s] = HFEngine(model, tokenizer).generate(
        make_requests(
            tokenizer, SamplingParams(**{**params.__dict__, "stop_token_ids": (stop_tok,)}), ["x" * 30]
        )
    )
    assert s.token_ids == full.token_ids[: first + 1] and s.finish_reason == "stop"
    assert full.finish_reason == "length" and full.num_tokens == 24


def test_caps_callbacks_and_timings(model, tokenizer):
    seen_tokens, finished = [], []
    engine = HFEngine(
        model,
        tokenizer,
        EngineConfig(max_concurrency=3),
        on_token=lambda rid, tok, lp, v: seen_tokens.append((rid, tok, lp, v)),
        on_finish=finished.append,
    )
    reqs = make_requests(tokenizer, GREEDY)
    for r in reqs:
        engine.add(r)
    done = []
    while engine.has_unfinished():
        done += engine.step()
        assert engine.num_running <= 3
    assert len(finished) == len(reqs) == len(done)
    assert len(seen_tokens) == sum(s.num_tokens for s in done)
    for s in done:
        t = s.timings
        assert t.arrival <= t.admitted <= t.first_token <= t.finished
        assert t.queue_s >= 0 and t.prefill_s >= 0 and t.decode_s >= 0
    assert max(s.timings.queue_s for s in done) > 0  # later requests waited for a slot


def test_priority_admission_orders_the_queue(model, tokenizer):
    engine = HFEngine(model, tokenizer, EngineConfig(max_concurrency=1), admission=Priority())
    order = []
    engine.on_finish = lambda s: order.append(s.request_id)
    params = SamplingParams(max_new_tokens=2, temperature=0, ignore_eos=True)
    for i, prio in enumerate([0.0, 5.0, 1.0]):
        engine.add(Request(f"p{i}", (5, 6, 7), params, priority=prio))
    while engine.has_unfinished():
        engine.step()
    assert order == ["p1", "p2", "p0"]


def test_bad_input_errors(model, tokenizer):
    with pytest.raises(ValueError, match="max_new_tokens must be > 0, got 0"):
        SamplingParams(max_new_tokens=0)
    with pytest.raises(ValueError, match="top_p must be in"):
        SamplingParams(top_p=0)
    engine = HFEngine(model, tokenizer, EngineConfig(max_model_len=64))
    with pytest.raises(ValueError, match="prompt of 80 tokens does not fit the model context of 64"):
        engine.add(Request("long", tuple([5] * 80)))
    engine.add(Request("a", (5, 6)))
    with pytest.raises(ValueError, match="already in the engine"):
        engine.add(Request("a", (5, 6)))
    with pytest.raises(ValueError, match="max_concurrency must be > 0, got 0"):
        EngineConfig(max_concurrency=0)
    with pytest.raises(KeyError, match="neither waiting nor running"):
        engine.abort("zzz")


@pytest.mark.parametrize(("kv_heads", "lq", "scale"), [(4, 1, None), (2, 1, 0.3), (4, 5, 0.2), (1, 6, None)])
def test_engine_attention_equals_sdpa(kv_heads, lq, scale):
    """The engine's two-matmul attention against torch's SDPA, grouped-query heads included."""
    from schedrl.engine.attention import _attend

    torch.manual_seed(0)
    q = torch.randn(7, 4, lq, 16)
    k, v = torch.randn(7, kv_heads, 9, 16), torch.randn(7, kv_heads, 9, 16)
    allowed = torch.rand(7, 1, lq, 9) < 0.7
    allowed[..., 0] = True  # every row sees at least one key
    mask = torch.zeros(allowed.shape).masked_fill_(~allowed, float("-inf"))
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=scale, enable_gqa=kv_heads != 4
    )
    torch.testing.assert_close(_attend(q, k, v, mask, scale), ref, rtol=1e-5, atol=1e-6)


def test_twin_prompts_are_prefilled_once_and_sample_as_if_computed_alone(model, tokenizer):
    """G samples of a prompt admitted together: one prefill, the same outputs as without sharing."""
    twins = [p for p in PROMPTS[:5] if len(tokenizer(p).input_ids) > 1]  # a 1-token prompt is a decode row
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    reqs = [
        Request(f"{p}/{g}", tuple(tokenizer(p).input_ids), SamplingParams(**{**params.__dict__, "seed": g}))
        for p in twins
        for g in range(4)
    ]
    runs = {}
    for share in (False, True):
        engine = HFEngine(model, tokenizer, EngineConfig(max_concurrency=16, prefill_prompt_once=share))
        seen = []
        forward = engine.model.forward
        engine.model.forward = lambda *a, _f=forward, _seen=seen, **k: (
            _seen.append(k["input_ids"].shape[1]) or _f(*a, **k)
        )
        runs[share] = (engine.generate(reqs), seen[0], engine.num_shared_prefill)
    (plain, plain_tokens, plain_shared), (shared, shared_tokens, n_shared) = runs[False], runs[True]
    prompt_tokens = sum(len(tokenizer(p).input_ids) for p in twins)
    assert plain_tokens == 4 * prompt_tokens and plain_shared == 0
    assert shared_tokens == prompt_tokens and n_shared == 3 * prompt_tokens  # each prompt computed once
    assert [s.token_ids for s in shared] == [s.token_ids for s in plain]
    assert len({s.token_ids for s in shared}) > 4  # the twins' own seeds: different samples of one prompt
    for a, b in zip(shared, plain, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
