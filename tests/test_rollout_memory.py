"""Memory-aware (Past-Future) admission: the peak formula and the budget in a real engine run."""

import random

import pytest

from schedrl.engine import EngineConfig, HFEngine
from schedrl.rollout import PastFutureAdmission, peak_kv_tokens
from schedrl.types import Request, SamplingParams


def simulated_peak(held, remaining):
    """Step the batch forward one token at a time and take the largest total."""
    held, remaining, peak = list(held), list(remaining), 0
    for _ in range(max(remaining, default=0)):
        held = [c + 1 if r > 0 else 0 for c, r in zip(held, remaining, strict=True)]
        remaining = [r - 1 for r in remaining]
        peak = max(peak, sum(held))
        held = [c if r > 0 else 0 for c, r in zip(held, remaining, strict=True)]  # a finished request frees
    return peak


def test_peak_formula_matches_a_step_by_step_simulation():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 6)
        held, remaining = [rng.randint(1, 20) for _ in range(n)], [rng.randint(1, 15) for _ in range(n)]
        assert peak_kv_tokens(held, remaining) == simulated_peak(held, remaining)


def workload(tokenizer, n=40, seed=0):
    rng = random.Random(seed)
    prompts = ["12+34=", "sort:31415926=", "7+8=", "rev:0123456789="]
    lengths = [rng.choice([2, 3, 4, 30]) for _ in range(n)]
    return [
        Request(
            f"r{i}",
            tuple(tokenizer(prompts[i % 4]).input_ids),
            SamplingParams(max_new_tokens=48, seed=i, ignore_eos=True, stop_token_ids=()),
            priority=0,
        )
        for i in range(n)
    ], lengths


def run_tracking_kv(engine, requests, lengths, learn=False):
    """Generate with fixed lengths (each request aborted when it reaches its length); KV after every step.
    With `learn`, each finished length also goes into the policy's history."""
    target = {r.id: n for r, n in zip(requests, lengths, strict=True)}
    prompt = {r.id: len(r.prompt_ids) for r in requests}
    counts: dict[str, int] = {}
    prev = engine.on_token

    def on_token(rid, tok, lp, version):
        counts[rid] = counts.get(rid, 0) + 1
        prev(rid, tok, lp, version)

    engine.on_token = on_token
    for r in requests:
        engine.add(r)
    usage, concurrency, done = [], [], []
    while engine.has_unfinished():
        engine.step()
        running = engine.running_ids
        usage.append(sum(prompt[i] + counts.get(i, 0) for i in running))
        concurrency.append(len(running))
        for rid in running:
            if counts.get(rid, 0) >= target[rid]:
                sample = engine.abort(rid)
                done.append(sample)
                if learn:
                    engine.admission.history.add(sample.num_tokens)
    return usage, concurrency, done


@pytest.mark.parametrize("with_history", [False, True])
def test_memory_admission_never_exceeds_its_budget(model, tokenizer, with_history):
    requests, lengths = workload(tokenizer)
    budget = 200
    policy = PastFutureAdmission(PastFutureAdmission.Args(kv_budget_tokens=budget, quantile=1.0))
    if with_history:  # past outputs cover the lengths to come
        for n in lengths:
            policy.history.add(n)
    engine = HFEngine(model, tokenizer, EngineConfig(max_concurrency=32), admission=policy)
    usage, concurrency, done = run_tracking_kv(engine, requests, lengths, learn=with_history)
    assert len(done) == len(requests)
    assert max(usage) <= budget
    assert max(concurrency) > 1  # it does batch, not run one request at a time
    # lengths known -> tighter predictions -> more requests at once than the safe bound allows
    if with_history:
        assert max(concurrency) >= 5


def test_a_request_too_large_for_the_budget_runs_alone(model, tokenizer):
    requests, lengths = workload(tokenizer, n=3)
    policy = PastFutureAdmission(PastFutureAdmission.Args(kv_budget_tokens=20, quantile=1.0))
    engine = HFEngine(model, tokenizer, EngineConfig(max_concurrency=8), admission=policy)
    usage, concurrency, done = run_tracking_kv(engine, requests, lengths)
    assert len(done) == 3 and max(concurrency) == 1


def test_bad_arguments_name_the_field():
    with pytest.raises(ValueError, match="argument 'kv_budget_tokens' must be > 0, got 0"):
        PastFutureAdmission.Args(kv_budget_tokens=0)
    with pytest.raises(ValueError, match=r"argument 'quantile' must be in \(0, 1\], got 1.5"):
        PastFutureAdmission.Args(kv_budget_tokens=10, quantile=1.5)
