"""Speculative prefix reuse: exactness of the acceptance rule under greedy decoding and under sampling."""

import copy

import pytest
import torch

from schedrl.engine import EngineConfig, HFEngine
from schedrl.rollout import DraftStore, verify_drafts
from schedrl.rollout.speculative import _sampling_probs
from schedrl.types import Request, Sample, SamplingParams

PROMPTS = ["12+34=", "sort:31415926=", "rev:0123456789=", "cd:3,5,7>22=", "9+9=", "sort:8812="]


def requests(tokenizer, params, tag, prompts=PROMPTS, seed0=0):
    return [
        Request(
            f"{tag}{i}",
            tuple(tokenizer(p).input_ids),
            SamplingParams(**{**vars(params), "seed": seed0 + i}),
            task_id=f"t{i}",
        )
        for i, p in enumerate(prompts)
    ]


def finish(engine, items):
    """Run what verification left to the engine; returns samples in request order."""
    todo = [x for x in items if isinstance(x, Request)]
    done = {s.request_id: s for s in engine.generate(todo)} if todo else {}
    return [x if isinstance(x, Sample) else done[x.id] for x in items]


def eos(model, tokenizer):
    return HFEngine(model, tokenizer, EngineConfig(max_concurrency=1)).eos_ids


def test_greedy_verification_accepts_only_the_current_policys_tokens(model, other_model, tokenizer):
    draft_params = SamplingParams(max_new_tokens=20, temperature=1.0)
    drafts = HFEngine(other_model, tokenizer).generate(requests(tokenizer, draft_params, "d"))
    greedy = SamplingParams(max_new_tokens=20, temperature=0)
    reqs = requests(tokenizer, greedy, "g")
    items, stats = verify_drafts(
        model, reqs, drafts, eos_ids=eos(model, tokenizer), tokenizer=tokenizer, draft_model=other_model
    )
    for item in items:  # every kept token is the current model's argmax after its prefix
        toks = list(item.prefix_ids if isinstance(item, Request) else item.token_ids)
        with torch.no_grad():
            logits = model(torch.tensor([list(item.prompt_ids) + toks])).logits[0]
        argmax = logits[len(item.prompt_ids) - 1 : -1].argmax(-1).tolist()
        assert toks == argmax
    # the other model's drafts differ from greedy decoding
    assert stats.drafts == len(reqs) and stats.accepted < stats.draft_tokens
    # ... and with the engine finishing the rest, the result is exactly greedy decoding.
    ref = HFEngine(model, tokenizer).generate(reqs)
    got = finish(HFEngine(model, tokenizer), items)
    assert [s.token_ids for s in got] == [s.token_ids for s in ref]
    assert [s.finish_reason for s in got] == [s.finish_reason for s in ref]


def test_a_draft_from_the_same_greedy_policy_is_accepted_whole(model, tokenizer):
    greedy = SamplingParams(max_new_tokens=20, temperature=0)
    drafts = HFEngine(model, tokenizer).generate(requests(tokenizer, greedy, "d"))
    items, stats = verify_drafts(
        model, requests(tokenizer, greedy, "g"), drafts, eos_ids=eos(model, tokenizer), tokenizer=tokenizer
    )
    assert stats.accepted == stats.draft_tokens and stats.rejected == 0
    assert all(isinstance(s, Sample) for s in items) and stats.completed == len(items)
    assert [s.token_ids for s in items] == [d.token_ids for d in drafts]
    for s, d in zip(items, drafts, strict=True):
        torch.testing.assert_close(torch.tensor(s.logprobs), torch.tensor(d.logprobs), atol=1e-5, rtol=0)


def exact_two_token_marginals(model, prompt, params, vocab):
    """p(t1) and p(t2) = sum_t1 p(t1) p(t2 | t1) under the engine's sampling rule (temperature, top-k)."""
    with torch.no_grad():
        p1 = _sampling_probs(model(torch.tensor([prompt])).logits[0, -1:].float(), params)[0]
        rows = torch.tensor([list(prompt) + [t] for t in range(vocab)])
        p2_given = _sampling_probs(model(rows).logits[:, -1].float(), params)  # (V, V)
    return p1, p1 @ p2_given


@pytest.fixture(scope="module")
def older_model(model):
    """The policy a few updates ago: `model` with small weight noise (draft acceptance ~0.5-0.8)."""
    older = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in older.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.15 * p.std())
    return older


def expected_tv(p, n):
    """E[TV(empirical of n draws, p)] ~ 1/2 sum_x sqrt(2 p(x)(1 - p(x)) / (pi n)) (normal approximation)."""
    return float(0.5 * (2 * p * (1 - p) / (torch.pi * n)).sqrt().sum())


@pytest.mark.train
@pytest.mark.parametrize(
    "current",
    [
        SamplingParams(max_new_tokens=2, temperature=1.0, ignore_eos=True),
        SamplingParams(max_new_tokens=2, temperature=0.8, top_k=4, ignore_eos=True),
    ],
    ids=["temperature", "top_k"],
)
def test_sampled_verification_follows_the_current_policy(model, older_model, tokenizer, current):
    """Drafts from an older policy (q), verified against `model` (p): the first two output tokens must follow
    p exactly. The TV distance of 3000 draws from the exact marginals must stay within 1.5x its sampling
    noise; the naive rule (at a rejection, resample from p instead of the residual) misses p by more than
    1.5x that bound, so the test tells them apart."""
    n, prompt = 3000, tuple(tokenizer("9+9=").input_ids)
    draft_params = SamplingParams(max_new_tokens=2, temperature=1.0, ignore_eos=True)
    drafts = HFEngine(older_model, tokenizer, EngineConfig(max_concurrency=256)).generate(
        [Request(f"d{i}", prompt, SamplingParams(**{**vars(draft_params), "seed": i})) for i in range(n)]
    )
    reqs = [
        Request(f"c{i}", prompt, SamplingParams(**{**vars(current), "seed": 10**6 + i})) for i in range(n)
    ]
    items, stats = verify_drafts(
        model,
        reqs,
        drafts,
        eos_ids=eos(model, tokenizer),
        tokenizer=tokenizer,
        draft_model=older_model,
        seed=7,
    )
    assert stats.accepted > n / 10 and stats.rejected > n / 5, stats  # both paths are exercised
    out = finish(HFEngine(model, tokenizer, EngineConfig(max_concurrency=256)), items)
    vocab = model.config.vocab_size
    p1, p2 = exact_two_token_marginals(model, prompt, current, vocab)
    tokens = torch.tensor([s.token_ids for s in out])
    for pos, p in ((0, p1), (1, p2)):
        tv = 0.5 * (torch.bincount(tokens[:, pos], minlength=vocab) / n - p).abs().sum().item()
        assert tv < 1.5 * expected_tv(p, n) + 0.005, (pos, tv, expected_tv(p, n))
    with torch.no_grad():
        q1 = _sampling_probs(older_model(torch.tensor([prompt])).logits[0, -1:].float(), draft_params)[0]
    both = torch.minimum(p1, q1)
    naive = both + (1 - both.sum()) * p1
    assert 0.5 * (naive - p1).abs().sum().item() > 1.5 * (1.5 * expected_tv(p1, n) + 0.005)


def test_restrictions_raise_clear_errors(model, other_model, tokenizer):
    params = SamplingParams(max_new_tokens=8, temperature=1.0, top_k=5)
    drafts = HFEngine(other_model, tokenizer).generate(requests(tokenizer, params, "d"))
    with pytest.raises(ValueError, match="sampled with top-k/top-p .* pass draft_model"):
        verify_drafts(model, requests(tokenizer, params, "c"), drafts, eos_ids=eos(model, tokenizer))
    plain = SamplingParams(max_new_tokens=8, temperature=1.0)
    drafts = HFEngine(other_model, tokenizer).generate(requests(tokenizer, plain, "d"))
    with pytest.raises(ValueError, match="residual needs the full draft distribution; pass draft_model"):
        verify_drafts(model, requests(tokenizer, plain, "c"), drafts, eos_ids=eos(model, tokenizer))
    stop = SamplingParams(max_new_tokens=8, temperature=1.0, stop_strings=("3",))
    with pytest.raises(ValueError, match="other stop rules"):
        verify_drafts(model, requests(tokenizer, stop, "c"), drafts, eos_ids=eos(model, tokenizer))


def test_draft_store_keeps_the_last_finished_sample_per_task_and_index(model, tokenizer):
    params = SamplingParams(max_new_tokens=6, temperature=1.0)
    first = HFEngine(model, tokenizer).generate(requests(tokenizer, params, "a"))
    second = HFEngine(model, tokenizer).generate(requests(tokenizer, params, "b", seed0=50))
    store = DraftStore()
    store.put(first)
    store.put(second)
    assert len(store) == len(PROMPTS)
    assert [store.get(r) for r in requests(tokenizer, params, "c")] == second


def test_packed_draft_logits_equal_separate_forwards(model, tokenizer):
    """Siblings share one packed row (prompt once, each draft masked to the prompt and itself)."""
    from schedrl.rollout.speculative import _draft_logits

    prompts = [tuple(tokenizer(p).input_ids) for p in ["12+34=", "12+34=", "12+34=", "sort:8812=", "7"]]
    gen = torch.Generator().manual_seed(0)
    drafts = [torch.randint(3, 60, (n,), generator=gen).tolist() for n in (5, 1, 9, 4, 7)]
    packed = _draft_logits(model, prompts, drafts, max_row=14)  # forces the 3 siblings into 2 rows
    for prompt, draft, got in zip(prompts, drafts, packed, strict=True):
        with torch.no_grad():
            ref = model(torch.tensor([list(prompt) + draft])).logits[0, len(prompt) - 1 : -1]
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
