"""Scheduling decisions the same on both engines: admission order, preemptions and what they recompute,
and pinned keys and values for a continuation (the `pin` tool-wait policy).

The built-in engine runs the decisions in its own loop; vLLM runs them inside its V1 scheduler
(`SchedRLScheduler`). Each check states the observable outcome in closed form (which request is
suspended at which step, how many computed tokens it gives back, the admission order) and compares the
tokens with an uninterrupted run, so each engine is checked on its own. The vLLM rows skip without the
`vllm` package; `.ci/run` runs them in `.venv-vllm`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from schedrl.engine import EngineConfig, HFEngine, Priority
from schedrl.engine.preemption import Running, swap_victims
from schedrl.rollout.attained import LeastAttained
from schedrl.types import Request, SamplingParams

BACKENDS = ["builtin", "vllm"]
# vLLM's CPU blocks are 128 tokens by default; 32 (its smallest on CPU) lets short histories hit its cache
VLLM_ARGS = {"kv_cache_memory_bytes": 64 << 20, "block_size": 32}


@pytest.fixture
def build(request):
    """`build(config, admission, clock=None, **vllm_args)` for the test's backend, on the peaked tiny model."""
    backend = request.getfixturevalue("backend")
    model, tokenizer = request.getfixturevalue("model"), request.getfixturevalue("tokenizer")
    made = []
    if backend == "vllm":
        pytest.importorskip("vllm")
        from schedrl.engine.vllm_engine import VLLMEngine

    def make(config, admission=None, clock=None, **vllm_args):
        extra = {"clock": clock} if clock is not None else {}
        if backend == "builtin":
            return HFEngine(model, tokenizer, config, admission=admission, **extra)
        engine = VLLMEngine(model, tokenizer, config, admission, vllm_args=VLLM_ARGS | vllm_args, **extra)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.close()


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=0, ignore_eos=True)


def run(engine, timeline: dict[int, list[Request]]) -> dict[str, tuple[int, ...]]:
    """Add `timeline[k]` before step k; step until done; each request's tokens."""
    out: dict[str, tuple[int, ...]] = {}
    k = 0
    while engine.has_unfinished() or any(step >= k for step in timeline):
        for r in timeline.get(k, []):
            engine.add(r)
        out.update((s.request_id, s.token_ids) for s in engine.step())
        k += 1
    return out


def uninterrupted(model, tokenizer, requests: list[Request]) -> dict[str, tuple[int, ...]]:
    engine = HFEngine(model, tokenizer, EngineConfig(max_concurrency=len(requests)))
    return {s.request_id: s.token_ids for s in engine.generate(requests)}


@pytest.mark.parametrize("backend", BACKENDS)
def test_priority_preemption_suspends_the_lowest_and_resumes_it_exactly(build, backend, model, tokenizer):
    low = Request("low", (5, 6, 7) * 15, greedy(60), priority=0.0)
    high = Request("high", (5, 6, 8), greedy(3), priority=5.0)
    engine = build(EngineConfig(max_concurrency=1), Priority(Priority.Args(preempt=True)))
    out = run(engine, {0: [low], 40: [high]})
    # step 40 suspends `low`, which has computed its 45-token prompt and 39 of its 40 tokens
    assert engine.preemptions == [(40, "low")]
    assert engine.num_preempted_tokens == 45 + 39
    assert engine.admissions == ["low", "high", "low"]
    assert out == uninterrupted(model, tokenizer, [low, high])
    if backend == "vllm":  # the resumed request found its full 32-token blocks in vLLM's prefix cache
        assert engine.prefix_cache["preempted_hits"] == 64
        assert engine.prefix_cache["preempted_queries"] == 45 + 40


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_preemption_without_a_strict_difference(build, backend, model, tokenizer):
    first = Request("first", (5, 6, 7), greedy(12), priority=1.0)
    same = Request("same", (5, 6, 8), greedy(3), priority=1.0)
    engine = build(EngineConfig(max_concurrency=1), Priority(Priority.Args(preempt=True)))
    run(engine, {0: [first], 4: [same]})
    assert engine.preemptions == [] and engine.admissions == ["first", "same"]
    plain = build(EngineConfig(max_concurrency=1), Priority())  # preempt off: priority orders admission only
    run(plain, {0: [first], 4: [Request("high", (5, 6, 8), greedy(3), priority=9.0)]})
    assert plain.preemptions == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_least_attained_service_preempts_the_most_served_program(build, backend, model, tokenizer):
    """Autellix: program a's first call runs; a's second call and b's call arrive later. b (no service)
    displaces a's running call once a has attained a quantum, and runs before a's second call."""
    a1 = Request("a1", (5, 6, 7), greedy(20), program="a")
    a2 = Request("a2", (5, 6, 9), greedy(4), program="a")
    b1 = Request("b1", (5, 6, 8), greedy(4), program="b")
    policy = LeastAttained(LeastAttained.Args(quantum=8))
    engine = build(EngineConfig(max_concurrency=1), policy)
    out = run(engine, {0: [a1], 3: [a2], 10: [b1]})
    # at step 10 program a has attained 10 tokens (level 1); b is at level 0: a1 is suspended
    assert engine.preemptions == [(10, "a1")]
    assert engine.num_preempted_tokens == 3 + 9
    # then b1 runs; a1 (suspended first, arrived first) and a2 share program a's level: a1 resumes first
    assert engine.admissions == ["a1", "b1", "a1", "a2"]
    assert policy.attained == {"a": 24, "b": 4}
    assert out == uninterrupted(model, tokenizer, [a1, a2, b1])


def test_swap_victims_pairs_the_best_waiting_with_the_worst_running():
    def req(rid, p):
        return Request(rid, (1,), priority=p)

    running = [Running(req("r0", 3), 5, 0), Running(req("r1", 1), 5, 1), Running(req("r2", 1), 5, 2)]
    waiting = [req("w0", 2), req("w1", 9), req("w2", 1)]
    key = lambda r: -r.priority  # noqa: E731
    # w1 (9) displaces the lowest-priority running one admitted last (r2); w0 (2) displaces r1; w2 (1) none
    assert swap_victims(running, waiting, 0, key) == ["r2", "r1"]
    assert swap_victims(running, waiting, 1, key) == ["r2"]  # w1 takes the free place, w0 displaces r2
    assert swap_victims(running, waiting, 3, key) == []


def test_preempting_a_request_that_is_not_running_names_it(model, tokenizer):
    engine = HFEngine(model, tokenizer, EngineConfig(max_concurrency=1))
    engine.add(Request("w", (5, 6), greedy(3)))
    with pytest.raises(KeyError, match="request 'w' is not running"):
        engine.preempt("w")


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def two_turns(engine, clock: Clock, keep_s: float, fillers: int, filler_len: int, wait_s: float = 1.0):
    """Turn 1 (100-token history), then `fillers` unrelated requests, then turn 2 continuing turn 1."""
    turn1 = Request("ep/turn0", tuple(range(3, 73)), greedy(30), keep_kv_s=keep_s)
    history = (*turn1.prompt_ids, *run(engine, {0: [turn1]})["ep/turn0"])
    run(
        engine, {0: [Request(f"f{i}", (4 + i, *range(9, 9 + filler_len)), greedy(1)) for i in range(fillers)]}
    )
    clock.t += wait_s
    turn2 = Request(
        "ep/turn1", (*history, 5, 6, 7, 8, 9), greedy(4), continues="ep/turn0" if keep_s else None
    )
    run(engine, {0: [turn2]})


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("keep_s", [0.0, 60.0])
def test_a_pinned_turn_keeps_its_keys_and_values_under_pressure(build, backend, keep_s):
    """Between the turns, fillers pass through every block of the cache: released, turn 1's keys and values
    are gone; pinned, turn 2 prefills only what its history does not cover."""
    clock = Clock()
    if backend == "builtin":
        engine = build(EngineConfig(max_concurrency=2, park_slots=1), clock=clock)
        two_turns(engine, clock, keep_s, fillers=24, filler_len=60)
        assert engine.num_reused == (99 if keep_s else 0)  # 70 + 30 tokens, the last one never computed
        return
    # a 24-block pool (32 tokens each) that 24 distinct fillers of 61 tokens pass through entirely
    engine = build(EngineConfig(max_concurrency=2), clock=clock, num_gpu_blocks_override=24)
    before = engine.prefix_cache["hits"]
    two_turns(engine, clock, keep_s, fillers=24, filler_len=60)
    hits = engine.prefix_cache["hits"] - before
    assert hits == (96 if keep_s else 0)  # the three full blocks of the 99 computed tokens
    assert engine.parked_ids == [] and engine.scheduler.pins == {}  # the continuation took the blocks


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_pin_past_its_time_to_live_is_given_up(build, backend):
    clock = Clock()
    config = (
        EngineConfig(max_concurrency=2, park_slots=1)
        if backend == "builtin"
        else EngineConfig(max_concurrency=2)
    )
    engine = build(config, clock=clock)
    turn1 = Request("ep/turn0", tuple(range(3, 73)), greedy(30), keep_kv_s=2.0)
    run(engine, {0: [turn1]})
    assert engine.parked_ids == ["ep/turn0"]
    clock.t += 1.0
    run(engine, {0: [Request("other", (4, 5), greedy(1))]})
    assert engine.parked_ids == ["ep/turn0"]  # within its time to live
    clock.t += 1.5
    run(engine, {0: [Request("other2", (4, 6), greedy(1))]})
    assert engine.parked_ids == []
    assert engine.evict("ep/turn0") is False


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_continuation_that_does_not_extend_the_pinned_history_is_refused(build, backend):
    config = (
        EngineConfig(max_concurrency=2, park_slots=1)
        if backend == "builtin"
        else EngineConfig(max_concurrency=2)
    )
    engine = build(config)
    run(engine, {0: [Request("t0", tuple(range(3, 40)), greedy(5), keep_kv_s=60.0)]})
    with pytest.raises(ValueError, match="request 't1' continues 't0' but its prompt does not start with"):
        engine.add(Request("t1", (3, 4, 5), greedy(2), continues="t0"))


LEARNED = str(Path(__file__).resolve().parents[1] / "bench" / "policies" / "admission_attention.pt")
# every registered admission policy, `learned` with the policy trained by bench/admission_rl.py
POLICIES = {
    "fcfs": {},
    "priority": {"preempt": True},
    "static": {},
    "lpt": {"predictor": "sibling"},
    "spt": {"predictor": "sibling"},
    "fcfs_guarded": {"predictor": "sibling"},
    "past_future": {"kv_budget_tokens": 200},
    "las": {"quantum": 6},
    "learned": {"checkpoint": LEARNED},
}


def test_every_admission_policy_is_in_the_contract():
    from schedrl.rollout.registry import ADMISSION

    assert sorted(ADMISSION.names()) == sorted(POLICIES)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_decides_the_same_on_both_engines(model, tokenizer, name):
    """The same arrivals under each policy: the same admission order, preemptions, given-back tokens and
    outputs on the built-in engine and inside vLLM's scheduler."""
    pytest.importorskip("vllm")
    from schedrl.engine.vllm_engine import VLLMEngine
    from schedrl.rollout.registry import make_admission

    def arrivals():
        reqs = [
            Request(
                f"r{i}",
                (5, 6, 7 + i % 3) * (1 + i % 4),
                greedy(n),
                priority=float(i % 3),
                group_id=f"g{i % 2}",
                program=f"p{i % 3}",
            )
            for i, n in enumerate([14, 3, 9, 5, 12, 2, 7])
        ]
        return {0: reqs[:3], 4: reqs[3:5], 9: reqs[5:]}

    seen = {}
    for backend in BACKENDS:
        config = EngineConfig(max_concurrency=2)
        policy = make_admission(name, **POLICIES[name])
        engine = (
            HFEngine(model, tokenizer, config, admission=policy)
            if backend == "builtin"
            else VLLMEngine(model, tokenizer, config, policy, vllm_args=VLLM_ARGS)
        )
        try:
            out = run(engine, arrivals())
            seen[backend] = (engine.admissions, engine.preemptions, engine.num_preempted_tokens, out)
        finally:
            if backend == "vllm":
                engine.close()
    assert seen["builtin"] == seen["vllm"]
    if name in ("priority", "las"):
        assert seen["builtin"][1], "the workload makes a preemptive policy preempt"


def test_pinned_episodes_on_vllm_equal_the_builtin_engines_and_reuse_their_history(model, tokenizer):
    """Multi-turn episodes under the `pin` tool-wait policy: the same trajectories on both engines; each
    continuation on vLLM finds its history's full blocks, as the built-in engine's its parked slot."""
    pytest.importorskip("vllm")
    from test_episodes import OneCall

    from schedrl.engine.vllm_engine import VLLMEngine
    from schedrl.envs import make_task
    from schedrl.envs.environment import Observation
    from schedrl.rollout.episodes import EpisodeRunner
    from schedrl.rollout.tool_wait import TOOL_WAITS

    class LongPrompt(OneCall):
        async def reset(self, task, seed: int) -> Observation:  # histories past vLLM's first 32-token blocks
            return Observation("Use the tool, then answer. " * 3 + task.prompt, "template")

    tasks = make_task("addition").sample("train", 4, seed=0)
    reqs = [
        Request(
            f"e{i}", tuple(tokenizer(t.prompt).input_ids), SamplingParams(40, temperature=0), task_id=t.id
        )
        for i, t in enumerate(tasks)
    ]
    out, reused = {}, {}
    for backend in BACKENDS:
        engine = (
            HFEngine(model, tokenizer, EngineConfig(max_concurrency=4, park_slots=4))
            if backend == "builtin"
            else VLLMEngine(model, tokenizer, EngineConfig(max_concurrency=4), vllm_args=VLLM_ARGS)
        )
        pin = TOOL_WAITS.build("pin", {"prior_wait_s": 5.0, "prefill_s_per_token": 1.0})
        runner = EpisodeRunner(engine, tokenizer, lambda: LongPrompt(), max_turns=3, tool_wait=pin)
        try:
            out[backend] = runner.run(reqs, {t.id: t for t in tasks})
            reused[backend] = engine.num_reused
            if backend == "vllm":
                assert engine.scheduler.num_pins_claimed == 4  # every continuation found its history pinned
        finally:
            runner.close()
            if backend == "vllm":
                engine.close()
    for a, b in zip(out["builtin"], out["vllm"], strict=True):
        assert a.token_ids == b.token_ids and a.reward == b.reward
    # the built-in engine reuses each history but its last token; vLLM whole 32-token blocks of it, and
    # of the prompt the four episodes share
    assert reused["builtin"] > 0 and reused["vllm"] > 0


def test_an_unsupported_vllm_version_names_the_supported_range():
    from schedrl.engine.vllm_engine import check_version

    check_version("0.32.0")
    check_version("0.32.5+cpu")
    for version in ("0.31.2", "0.33.0", "1.0.0", "dev"):
        with pytest.raises(RuntimeError, match=rf"vLLM {version} is not supported: .*vllm>=0\.32,<0\.33"):
            check_version(version)


def test_an_engines_event_log_keeps_the_newest_half_past_its_cap():
    from schedrl.engine.base import LOG_CAP, log_event

    log: list[int] = []
    for i in range(LOG_CAP + 1):
        log_event(log, i)
    assert log == list(range(LOG_CAP // 2, LOG_CAP + 1))  # the oldest half of LOG_CAP + 1 entries dropped
