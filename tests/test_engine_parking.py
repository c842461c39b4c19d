"""Parking: a finished request keeps its keys and values, and a continuation prefills only its new tokens.

The reference is the same continuation run as a fresh request (its whole prompt prefilled): sampled
tokens equal, log-probs equal up to float rounding, fewer tokens computed.
"""

import pytest
import torch

from schedrl.engine import EngineConfig, HFEngine
from schedrl.types import Request, SamplingParams

TOOL = "=42;ok"  # what a tool answers, appended after the model's turn


def turn(tokenizer, rid, prompt, **kw):
    params = SamplingParams(
        max_new_tokens=kw.pop("max_new_tokens", 6), temperature=0.8, seed=kw.pop("seed", 5)
    )
    return Request(rid, tuple(prompt), params, **kw)


def continuation(tokenizer, first, parked_id=None, tool=TOOL, rid="c"):
    ids = (*first.prompt_ids, *first.token_ids, *tokenizer(tool, add_special_tokens=False).input_ids)
    return turn(tokenizer, rid, ids, seed=9, continues=parked_id)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def run_first(engine, tokenizer, prompts, keep_kv_s=10.0):
    reqs = [
        turn(tokenizer, f"t{i}", tokenizer(p).input_ids, keep_kv_s=keep_kv_s) for i, p in enumerate(prompts)
    ]
    return engine.generate(reqs)


def reference(default_model, tokenizer, requests):
    """The same requests as fresh ones, in an engine that never parks."""
    fresh = [Request(r.id, r.prompt_ids, r.params) for r in requests]
    return HFEngine(default_model, tokenizer, EngineConfig(max_concurrency=8)).generate(fresh)


def assert_same(samples, refs):
    for s, ref in zip(samples, refs, strict=True):
        assert s.token_ids == ref.token_ids
        assert torch.allclose(torch.tensor(s.logprobs), torch.tensor(ref.logprobs), atol=1e-4)


def test_continuation_of_a_parked_request_equals_a_fresh_prefill(default_model, tokenizer):
    engine = HFEngine(default_model, tokenizer, EngineConfig(max_concurrency=4))
    (first,) = run_first(engine, tokenizer, ["12+34="])
    assert engine.parked_ids == ["t0"] and not engine.has_unfinished()
    cont = continuation(tokenizer, first, "t0")
    before = engine.num_prefill_tokens
    (out,) = engine.generate([cont])
    assert_same([out], reference(default_model, tokenizer, [cont]))
    # Only the last sampled token and the tool's answer were computed; the history came from the slot.
    history = len(first.prompt_ids) + len(first.token_ids) - 1
    assert engine.num_reused == history
    assert engine.num_prefill_tokens - before == len(cont.prompt_ids) - history
    assert engine.parked_ids == []  # the continuation took the slot back; it did not park itself


def test_many_continuations_of_different_lengths_in_one_step_beside_decoding_rows(default_model, tokenizer):
    prompts = ["12+34=", "sort:31415926=", "7"]
    engine = HFEngine(default_model, tokenizer, EngineConfig(max_concurrency=8))
    firsts = run_first(engine, tokenizer, prompts)
    tools = ["=1", "=123456789;", "=ok;" * 5]
    conts = [
        continuation(tokenizer, f, f.request_id, t, f"c{i}")
        for i, (f, t) in enumerate(zip(firsts, tools, strict=True))
    ]
    decoding = turn(tokenizer, "d", tokenizer("rev:0123=").input_ids, max_new_tokens=12)
    engine.add(decoding)
    engine.step()  # `decoding` is prefilled; the continuations join while it decodes
    outs = engine.generate(conts)
    assert engine.num_reused == sum(len(f.prompt_ids) + len(f.token_ids) - 1 for f in firsts)
    assert_same(outs, reference(default_model, tokenizer, conts))


def test_an_admission_that_needs_the_slot_evicts_and_the_continuation_prefills_everything(
    default_model, tokenizer
):
    engine = HFEngine(default_model, tokenizer, EngineConfig(max_concurrency=1))
    (first,) = run_first(engine, tokenizer, ["12+34="])
    engine.generate([turn(tokenizer, "other", tokenizer("99+1=").input_ids)])  # needs the only slot
    assert engine.num_evicted == 1 and engine.parked_ids == []
    cont = continuation(tokenizer, first, "t0")
    (out,) = engine.generate([cont])
    assert engine.num_reused == 0
    assert_same([out], reference(default_model, tokenizer, [cont]))


def test_the_parked_request_closest_to_expiry_is_evicted_first(default_model, tokenizer):
    clock = Clock()
    engine = HFEngine(default_model, tokenizer, EngineConfig(max_concurrency=2), clock=clock)
    engine.generate([turn(tokenizer, "long", tokenizer("1").input_ids, keep_kv_s=50.0)])
    engine.generate([turn(tokenizer, "short", tokenizer("2").input_ids, keep_kv_s=5.0)])
    engine.generate([turn(tokenizer, "fresh", tokenizer("3").input_ids)])
    assert engine.parked_ids == ["long"]


def test_a_parked_slot_is_given_up_when_its_time_runs_out(default_model, tokenizer):
    clock = Clock()
    engine = HFEngine(default_model, tokenizer, EngineConfig(max_concurrency=2), clock=clock)
    (first,) = run_first(engine, tokenizer, ["12+34="], keep_kv_s=1.0)
    clock.t = 2.0
    cont = continuation(tokenizer, first, "t0")
    (out,) = engine.generate([cont])
    assert engine.num_expired == 1 and engine.num_evicted == 0 and engine.num_reused == 0
    assert_same([out], reference(default_model, tokenizer, [cont]))


def test_evict_frees_the_slot_and_reports_whether_it_was_parked(default_model, tokenizer):
    engine = HFEngine(default_model, tokenizer, EngineConfig(max_concurrency=1))
    run_first(engine, tokenizer, ["12+34="])
    assert engine.evict("t0") is True and engine.evict("t0") is False
    assert engine.num_evicted == 0  # given up by its owner, not under pressure
    engine.generate([turn(tokenizer, "x", tokenizer("5").input_ids)])
    assert engine.num_evicted == 0


def test_a_continuation_whose_prompt_does_not_extend_the_parked_tokens_is_refused(default_model, tokenizer):
    engine = HFEngine(default_model, tokenizer, EngineConfig(max_concurrency=2))
    run_first(engine, tokenizer, ["12+34="])
    with pytest.raises(ValueError, match="continues 't0' but its prompt does not start"):
        engine.add(turn(tokenizer, "c", tokenizer("99+1=").input_ids, continues="t0"))


def test_aborted_requests_never_park(default_model, tokenizer):
    engine = HFEngine(default_model, tokenizer, EngineConfig(max_concurrency=2))
    engine.add(turn(tokenizer, "a", tokenizer("12+34=").input_ids, keep_kv_s=10.0, max_new_tokens=20))
    engine.step()
    engine.abort("a")
    assert engine.parked_ids == []


def test_park_slots_hold_parked_requests_beside_a_full_running_batch(default_model, tokenizer):
    engine = HFEngine(default_model, tokenizer, EngineConfig(max_concurrency=1, park_slots=1))
    (first,) = run_first(engine, tokenizer, ["12+34="])
    for i in range(3):  # fresh work in the only running place; the parked slot is left alone
        engine.add(turn(tokenizer, f"o{i}", tokenizer(f"{i}+1=").input_ids))
    while engine.has_unfinished():
        engine.step()
        assert engine.num_running <= 1
    assert engine.num_evicted == 0 and engine.parked_ids == ["t0"]
    cont = continuation(tokenizer, first, "t0")
    (out,) = engine.generate([cont])
    assert engine.num_reused > 0
    assert_same([out], reference(default_model, tokenizer, [cont]))


def test_a_continuation_waits_for_a_place_in_the_running_batch(default_model, tokenizer):
    engine = HFEngine(default_model, tokenizer, EngineConfig(max_concurrency=1, park_slots=1))
    (first,) = run_first(engine, tokenizer, ["12+34="])
    engine.add(turn(tokenizer, "busy", tokenizer("99+1=").input_ids, max_new_tokens=4))
    engine.step()  # "busy" takes the running place
    engine.add(continuation(tokenizer, first, "t0"))
    engine.step()
    assert engine.running_ids == ["busy"] and engine.waiting_ids == ["c"]
    engine.generate([])
    while engine.has_unfinished():
        engine.step()
    assert engine.num_reused > 0


def test_a_slot_whose_continuation_arrived_in_time_does_not_expire_while_it_queues(default_model, tokenizer):
    clock = Clock()
    engine = HFEngine(default_model, tokenizer, EngineConfig(max_concurrency=1, park_slots=1), clock=clock)
    (first,) = run_first(engine, tokenizer, ["12+34="], keep_kv_s=1.0)
    engine.add(turn(tokenizer, "busy", tokenizer("99+1=").input_ids, max_new_tokens=4))
    engine.step()
    engine.add(continuation(tokenizer, first, "t0"))  # in time, but the running place is taken
    clock.t = 5.0  # past the time to live while it queues
    while engine.has_unfinished():
        engine.step()
    assert engine.num_evicted == 0 and engine.num_reused > 0
