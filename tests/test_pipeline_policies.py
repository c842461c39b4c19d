"""The pipeline's policies in isolation: what each weight-sync policy does to the engines, and which
groups each consumption policy hands the next update."""

from __future__ import annotations

import pytest

from schedrl.envs import Task
from schedrl.orchestrate.buffer import Group
from schedrl.orchestrate.consumption import CONSUMPTION
from schedrl.orchestrate.staleness import expected_update
from schedrl.orchestrate.weight_sync import WEIGHT_SYNC
from schedrl.types import Request, Sample, SamplingParams


class FakeFleet:
    def __init__(self, busy: bool) -> None:
        self.calls: list[tuple] = []
        self.busy, self.staged = busy, None

    @property
    def idle(self) -> bool:
        return not self.busy

    def push(self, weights, version):
        self.calls.append(("push", version))

    def stage(self, weights, version):
        self.staged = (weights, version)

    def flush(self):
        if self.staged is not None:
            self.push(*self.staged)
            self.staged = None

    def cut(self):
        self.calls.append(("cut",))
        self.busy = False


def test_weight_sync_policies():
    for name, busy, calls, admits in [
        ("inflight", True, [("push", 3)], True),  # at once, mid-sequence
        ("cut_resume", True, [("cut",), ("push", 3), ("resend",)], True),
        ("drain", False, [("push", 3)], True),  # nothing in flight: at once
        ("drain", True, [], False),  # staged until the engines drain; no admission meanwhile
    ]:
        fleet = FakeFleet(busy)
        policy = WEIGHT_SYNC.get(name)()
        policy.on_update(fleet, {"w": 1}, 3, lambda f=fleet: f.calls.append(("resend",)))
        assert fleet.calls == calls, name
        assert policy.admits(fleet) is admits, name
    fleet = FakeFleet(True)
    drain = WEIGHT_SYNC.get("drain")()
    drain.on_update(fleet, {"w": 1}, 4, lambda: None)
    fleet.busy = False  # the engines drained
    assert drain.admits(fleet) and fleet.calls == [("push", 4)] and fleet.staged is None
    assert [WEIGHT_SYNC.get(n).off_policy for n in ("drain", "inflight", "cut_resume")] == [False, True, True]


def _group(gid: str, wave: int, n: int, done: int, admitted: bool = True) -> Group:
    task = Task(id=gid, prompt="1+1=", answer="2", domain="addition")
    reqs = [Request(f"{gid}/{i}", (1, 2), SamplingParams(4), group_id=gid, sample_index=i) for i in range(n)]
    g = Group(gid, task, reqs, wave=wave, admitted=admitted)
    for i in range(done):
        g.done[i] = Sample(f"{gid}/{i}", (1, 2), (3,), (-0.1,), (0,), "stop", SamplingParams(4), reward=1.0)
    return g


def test_wave_takes_exactly_the_oldest_whole_batch():
    wave = CONSUMPTION.get("wave")(budget=8)
    queue = [_group("a", 0, 4, 4), _group("b", 0, 4, 3), _group("c", 1, 4, 4)]
    assert wave.take(queue) is None  # wave 0 is not complete; wave 1 waits its turn
    queue[1].done[3] = queue[1].done[0]
    assert [g.id for g in wave.take(queue)] == ["a", "b"]
    ahead, per_update = wave.position(queue, queue[2])
    assert (ahead, per_update) == (1, 1) and expected_update(5, ahead, per_update) == 6


def test_partial_takes_the_oldest_complete_groups_to_a_step_of_samples():
    partial = CONSUMPTION.build("partial", {"overprovision": 1.5}, 8)
    queue = [_group("a", 0, 4, 3), _group("b", 0, 4, 4), _group("c", 1, 4, 4), _group("d", 1, 4, 4)]
    assert [g.id for g in partial.take(queue)] == ["b", "c"]  # a's straggler does not hold the step
    assert partial.take(queue[:2]) is None  # 4 complete samples < 8
    fresh = _group("e", 2, 4, 0, admitted=False)
    ahead, per_update = partial.position([*queue, fresh], fresh)
    assert (ahead, per_update) == (16, 12)  # 16 samples admitted ahead, 1.5 x 8 consumed per update
    assert expected_update(0, ahead, per_update) == 1


@pytest.mark.parametrize("name", ["wave", "partial"])
def test_nothing_admitted_is_nothing_to_take(name):
    policy = CONSUMPTION.get(name)(budget=4)
    assert policy.take([_group("a", 0, 4, 0, admitted=False)]) is None


def test_drain_never_pushes_older_weights_over_newer():
    """v1 waits for a busy engine; the engine drains and v2 arrives before the next admission: v2 reaches
    the engines and v1 is never pushed after it."""
    fleet = FakeFleet(True)
    drain = WEIGHT_SYNC.get("drain")()
    drain.on_update(fleet, {"w": 1}, 1, lambda: None)
    fleet.busy = False
    drain.on_update(fleet, {"w": 2}, 2, lambda: None)
    assert drain.admits(fleet) and fleet.calls == [("push", 2)]
