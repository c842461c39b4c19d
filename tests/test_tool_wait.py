"""Tool-wait policies: their closed-form decisions, and what each does to episodes on the engine
(on a virtual clock, so the timings are exact)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from schedrl.engine import EngineConfig, HFEngine, Priority
from schedrl.envs import make_task
from schedrl.envs.environment import Observation, StepResult
from schedrl.rollout.clock import VirtualClock, linear_step_cost
from schedrl.rollout.episodes import EpisodeRunner
from schedrl.rollout.tool_wait import (
    TOOL_WAITS,
    Back,
    LockStep,
    Pin,
    Release,
    ReturnsFirst,
    ToolWaitPolicy,
    Turn,
    make_tool_wait,
)
from schedrl.types import Request, SamplingParams


class Delayed:
    """Answers `turns - 1` tool calls, each `latency_s[i]` late (declared, on a virtual clock), then scores 1."""

    stop_strings = ()

    def __init__(self, latencies: list[float], answer: str = "=7;") -> None:
        self.latencies, self.answer, self.n = latencies, answer, 0

    async def reset(self, task, seed: int) -> Observation:
        self.n = 0
        return Observation(task.prompt, "template")

    async def step(self, action: str) -> StepResult:
        latency = self.latencies[min(self.n, len(self.latencies) - 1)]
        self.n += 1
        if self.n >= 3:
            return StepResult(None, 1.0, done=True, info={"latency_s": latency})
        return StepResult(Observation(self.answer, "tool"), None, done=False, info={"latency_s": latency})

    async def close(self) -> None:
        return None


class Recording(HFEngine):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.added: dict[str, float] = {}  # request id -> virtual time it was added
        self.admitted: list[str] = []

    def add(self, request: Request) -> None:
        self.added[request.id] = self.clock()
        super().add(request)

    def _start(self, req, now, held=None) -> None:
        self.admitted.append(req.id)
        super()._start(req, now, held)


COST = linear_step_cost(0.01, 0.0001, 0.001)


def run(model, tokenizer, policy, latencies, n=3, concurrency=4, admission=None, envs=None):
    clock = VirtualClock(COST)
    engine = Recording(
        model, tokenizer, EngineConfig(max_concurrency=concurrency), admission=admission, clock=clock
    )
    tasks = make_task("addition").sample("train", n, seed=0)
    reqs = [
        Request(f"e{i}", tuple(tokenizer(t.prompt).input_ids), SamplingParams(18, seed=i), task_id=t.id)
        for i, t in enumerate(tasks)
    ]
    made = iter(envs or [Delayed(latencies[i % len(latencies)]) for i in range(n)])
    runner = EpisodeRunner(
        engine, tokenizer, lambda: next(made), max_turns=3, max_turn_tokens=6, tool_wait=policy, clock=clock
    )
    try:
        samples = runner.run(reqs, {t.id: t for t in tasks})
    finally:
        runner.close()
    return samples, engine, runner, clock


# ---- decisions ------------------------------------------------------------------------------
def test_pin_keeps_for_the_predicted_wait_quantile_and_releases_when_the_saving_is_small():
    pin = Pin(Pin.Args(quantile=0.9, prior_wait_s=2.0, prefill_s_per_token=1e-3, min_saving=1.0))
    assert pin.keep_s(Turn("e", 0, 4, 5000)) == 2.0  # no wait observed yet: the prior
    for w in [0.1 * i for i in range(1, 11)]:  # 0.1 .. 1.0
        pin.observe(Back("e", 1, 4, 10, w))
    assert pin.predicted_wait_s() == pytest.approx(1.0)  # sorted[int(0.9 * 10)] = the 10th
    assert pin.keep_s(Turn("e", 1, 4, 1000)) == pytest.approx(1.0)  # re-prefill 1.0 s >= 1.0 * 1.0 s
    assert pin.keep_s(Turn("e", 1, 4, 999)) == 0.0  # 0.999 s saved < 1 s held: release
    assert pin.keep_s(Turn("e", 3, 4, 10**6)) == 0.0  # the last possible turn: nothing follows
    assert Pin(Pin.Args(max_keep_s=0.5, prior_wait_s=2.0)).keep_s(Turn("e", 0, 4, 1)) == 0.5
    fast = Pin(Pin.Args(min_keep_s=0.1))
    fast.observe(Back("e", 1, 4, 10, 0.001))
    assert fast.keep_s(Turn("e", 1, 4, 10)) == 0.1  # never below the floor: the loop's own latency
    # a long engine step (a burst of prefills on long histories) delays the hand-on: the time to live covers it
    assert pin.keep_s(Turn("e", 1, 4, 5000, step_s=1.5)) == pytest.approx(1.0 + 1.5)
    assert pin.keep_s(Turn("e", 1, 4, 2000, step_s=1.5)) == 0.0  # 2.0 s saved < 2.5 s held: release


def test_returning_priorities_in_closed_form():
    back = Back("e", 1, 4, 100, 0.3, ("ok", "error"), model_tokens=9)
    assert ReturnsFirst(ReturnsFirst.Args("progress")).priority(back) == pytest.approx(1 + 0.999 * 0.25)
    assert ReturnsFirst(ReturnsFirst.Args("attained")).priority(back) == pytest.approx(1 + 0.999 / 10)
    assert ReturnsFirst(ReturnsFirst.Args("outcome")).priority(back) == pytest.approx(1 + 0.499 * 0.25)
    ok = Back("e", 1, 4, 100, 0.3, ("ok",))
    assert ReturnsFirst(ReturnsFirst.Args("outcome")).priority(ok) == pytest.approx(1.5 + 0.499 * 0.25)
    assert Release().priority(back) == 0 and Pin().priority(back) == 0
    assert Pin(Pin.Args(priority="progress")).priority(back) == ReturnsFirst(
        ReturnsFirst.Args("progress")
    ).priority(back)


def test_names_and_bad_arguments():
    assert {"release", "pin", "priority", "lockstep"} <= set(TOOL_WAITS.names())
    assert isinstance(make_tool_wait("pin", quantile=0.5), Pin)
    with pytest.raises(ValueError, match="unknown tool-wait policy 'hold'; valid: lockstep, pin"):
        make_tool_wait("hold")
    with pytest.raises(ValueError, match="tool-wait policy 'release' takes no arguments, got ttl"):
        make_tool_wait("release", ttl=3)
    with pytest.raises(
        ValueError,
        match="tool-wait policy 'priority': argument 'by' must be one of progress, attained, outcome, got 'fastest'",
    ):
        make_tool_wait("priority", by="fastest")
    with pytest.raises(ValueError, match=r"argument 'quantile' must be in \(0, 1\], got 0"):
        Pin.Args(quantile=0)
    with pytest.raises(ValueError, match="tool-wait policy 'pin': unknown argument 'ttl'; valid: quantile"):
        make_tool_wait("pin", ttl=3)
    with pytest.raises(ValueError, match=r"'pin': argument 'min_keep_s' must be in \(0, max_keep_s\], got 2"):
        TOOL_WAITS.check("pin", {"max_keep_s": 1, "min_keep_s": 2})


# ---- on the engine ---------------------------------------------------------------------------
def test_pin_reuses_the_history_and_samples_what_release_samples(model, tokenizer):
    lat = [[0.05, 0.05, 0.05]]
    released, e_rel, _, _ = run(model, tokenizer, Release(), lat)
    pinned, e_pin, _, _ = run(model, tokenizer, Pin(Pin.Args(prior_wait_s=1.0)), lat)
    for a, b in zip(released, pinned, strict=True):
        assert a.token_ids == b.token_ids and a.trained == b.trained
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
    assert e_rel.num_reused == 0 and e_pin.num_reused > 0
    assert e_pin.num_prefill_tokens == e_rel.num_prefill_tokens - e_pin.num_reused
    assert e_pin.parked_ids == []  # every episode's last parked slot was given back when it ended


def test_a_wait_past_the_time_to_live_prefills_again(model, tokenizer):
    _, engine, _, _ = run(
        model,
        tokenizer,
        Pin(Pin.Args(prior_wait_s=0.01, max_keep_s=0.01, min_keep_s=0.01)),
        [[5.0, 5.0, 5.0]],
    )
    assert engine.num_reused == 0 and engine.num_expired > 0 and engine.parked_ids == []


def test_pin_needs_an_engine_that_parks(model, tokenizer):
    class NoParking:
        pass

    with pytest.raises(ValueError, match="Pin keeps keys and values during waits, which NoParking cannot"):
        EpisodeRunner(NoParking(), tokenizer, lambda: None, tool_wait=Pin())  # type: ignore[arg-type]


def test_lockstep_starts_each_turn_after_the_slowest_answer_of_the_batch(model, tokenizer):
    lat = [[0.1, 0.1], [2.0, 2.0], [0.3, 0.3]]
    _, engine, runner, clock = run(model, tokenizer, LockStep(), lat)
    second = [t for r, t in engine.added.items() if r.endswith("/turn1")]
    first_done = max(t for r, t in engine.added.items() if r.endswith("/turn0"))
    assert len(second) == 3 and min(second) >= first_done + 2.0  # everyone waited for the 2 s tool
    _, free, free_runner, free_clock = run(model, tokenizer, Release(), lat)
    fast = [t for r, t in free.added.items() if r.endswith("/turn1") and not r.startswith("e1")]
    assert max(fast) < min(second)  # without the barrier, the fast episodes went on at once
    assert free_clock.now() < clock.now()
    assert sorted(free_runner.last_latencies)[0] < sorted(runner.last_latencies)[0]


def test_returning_turns_are_admitted_ahead_of_fresh_ones_under_priority(model, tokenizer):
    lat = [[0.0, 0.0]]
    _, fcfs, _, _ = run(model, tokenizer, Release(), lat, n=4, concurrency=1, admission=Priority())
    _, first, _, _ = run(
        model,
        tokenizer,
        ReturnsFirst(ReturnsFirst.Args("progress")),
        lat,
        n=4,
        concurrency=1,
        admission=Priority(),
    )
    assert fcfs.admitted[:4] == ["e0/turn0", "e1/turn0", "e2/turn0", "e3/turn0"]  # fresh ones queued first
    assert first.admitted[:3] == ["e0/turn0", "e0/turn1", "e0/turn2"]  # e0 runs to its end first


def test_virtual_runs_are_deterministic(model, tokenizer):
    lat = [[0.2, 1.5], [0.05, 0.4], [3.0, 0.1]]
    a = run(model, tokenizer, Pin(Pin.Args(priority="progress")), lat, admission=Priority())
    b = run(model, tokenizer, Pin(Pin.Args(priority="progress")), lat, admission=Priority())
    assert a[3].now() == b[3].now() and a[2].last_latencies == b[2].last_latencies
    assert [s.token_ids for s in a[0]] == [s.token_ids for s in b[0]]
    assert a[2].peak_cached_tokens == b[2].peak_cached_tokens > 0


def test_config_names_the_field_of_a_bad_tool_wait():
    from schedrl.config import ConfigError, config_from_dict
    from schedrl.orchestrate.schedule import check_schedule

    def check(schedule):
        check_schedule(config_from_dict({"schedule": schedule}).schedule)

    with pytest.raises(ConfigError, match="'schedule.tool_wait': unknown tool-wait policy 'keep'"):
        check({"tool_wait": "keep"})
    with pytest.raises(
        ConfigError, match="'schedule.tool_wait': tool-wait policy 'pin': unknown argument 'ttl'"
    ):
        check({"tool_wait": "pin", "tool_wait_args": {"ttl": 1}})


# ---- the registry's contract -----------------------------------------------------------------
def test_orders_returns_says_whether_a_policy_sets_priorities():
    back = Back("e", 1, 4, 100, 0.3, ("ok",))
    for name, args in [
        ("release", {}),
        ("lockstep", {}),
        ("pin", {}),
        ("pin", {"priority": "attained"}),
        ("priority", {"by": "outcome"}),
    ]:
        policy = make_tool_wait(name, **args)
        assert isinstance(policy, ToolWaitPolicy)
        assert policy.orders_returns == (policy.priority(back) != 0), (name, args)


class Hold:
    """Keeps every slot for a fixed time (a user's own policy)."""

    lockstep = False
    parks = True
    orders_returns = False

    @dataclass(frozen=True)
    class Args:
        keep_s: float = 1.0  # how long a slot is kept

    def __init__(self, args: Args = Args()) -> None:
        self.seconds = args.keep_s

    def keep_s(self, turn: Turn) -> float:
        return self.seconds

    def priority(self, back: Back) -> float:
        return 0.0

    def observe(self, back: Back) -> None:
        pass


def test_a_users_policy_builds_by_dotted_path():
    policy = make_tool_wait("tests.test_tool_wait:Hold", keep_s=2.5)
    assert isinstance(policy, ToolWaitPolicy) and policy.keep_s(Turn("e", 0, 4, 10)) == 2.5
    with pytest.raises(
        ValueError, match="tool-wait policy 'tests.test_tool_wait:Hold': unknown argument 'ttl'"
    ):
        TOOL_WAITS.check("tests.test_tool_wait:Hold", {"ttl": 1})


def test_the_runner_tells_the_policy_its_longest_recent_step(model, tokenizer):
    """`Turn.step_s` is the longest of the engine's recent steps on the run's clock: with the cost model
    COST, a step is 10 ms + 0.1 ms a decode row + 1 ms a prefill token."""
    seen: list[Turn] = []

    class Seeing(Release):
        def keep_s(self, turn: Turn) -> float:
            seen.append(turn)
            return 0.0

    run(model, tokenizer, Seeing(), [[0.5, 0.5]], n=2)
    assert seen[0].step_s == 0.0  # the first turns start before any step
    later = [t.step_s for t in seen if t.turn > 0]
    prompt = len(tokenizer(make_task("addition").sample("train", 2, seed=0)[0].prompt).input_ids)
    # the first step prefilled both prompts: the longest step any later turn has seen
    assert max(later) >= 0.01 + 0.001 * prompt
    assert all(s <= 0.01 + 0.001 * 2 * 64 for s in later)
