"""`ThreadBackend`: each worker on its own thread, calls in order per worker, workers at the same time."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from schedrl.distributed import ThreadBackend, make_backend


class Toy:
    """A worker that records which thread ran each call, and can block on another worker."""

    def __init__(self, name: str) -> None:
        self.name, self.calls, self.event = name, [], threading.Event()
        self.built_on = threading.get_ident()

    def record(self, x):
        self.calls.append((x, threading.get_ident()))
        return x

    def block_until(self, event: threading.Event) -> bool:
        return event.wait(timeout=10)

    def release(self) -> threading.Event:
        self.event.set()
        return self.event

    def pair(self, a, b):
        return a + b, a * b

    def fail(self):
        raise ValueError("bad call")

    def affinity(self):
        return os.sched_getaffinity(0)


@pytest.fixture
def backend():
    b = ThreadBackend(num_engines=1, engine_cpus=1, learner_cpus=1)
    yield b
    b.shutdown()


def test_calls_run_in_order_on_the_workers_own_thread(backend):
    a = backend.start_worker("a", Toy, "a")
    refs = [backend.call(a, "record", i) for i in range(20)]
    assert [backend.get(r) for r in refs] == list(range(20))
    toy = a.instance.result()
    threads = {t for _, t in toy.calls}
    assert [x for x, _ in toy.calls] == list(range(20)) and threads == {toy.built_on}
    assert toy.built_on != threading.get_ident()


def test_workers_run_at_the_same_time(backend):
    """Worker a blocks until worker b sets an event: one thread for both would time out."""
    a, b = backend.start_worker("a", Toy, "a"), backend.start_worker("b", Toy, "b")
    event = b.instance.result().event
    blocked = backend.call(a, "block_until", event)
    assert backend.wait([blocked], timeout=0.2) == []  # still blocked
    backend.call(b, "release")
    assert backend.wait([blocked], timeout=10) == [blocked] and backend.get(blocked) is True


def test_results_pass_between_workers_and_errors_surface_on_get(backend):
    a, b = backend.start_worker("a", Toy, "a"), backend.start_worker("b", Toy, "b")
    s, p = backend.call(a, "pair", 3, 4, num_returns=2)
    assert backend.get(backend.call(b, "record", s)) == 7  # a result of a's call, resolved on b's thread
    assert backend.get(p) == 12
    assert backend.get(backend.call(b, "record", backend.put("x"))) == "x"
    with pytest.raises(ValueError, match="bad call"):
        backend.get(backend.call(a, "fail"))
    assert backend.get(backend.call(a, "record", 1)) == 1  # the worker lives on after a failed call


def test_torch_threads_are_one_while_running_and_restored():
    before = torch.get_num_threads()
    b = make_backend("threads", num_engines=1, engine_cpus=1, learner_cpus=1, address=None)
    assert isinstance(b, ThreadBackend) and torch.get_num_threads() == 1
    b.shutdown()
    assert torch.get_num_threads() == before


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs thread affinity and 2 cores",
)
def test_worker_threads_are_pinned_to_their_cores_and_the_caller_is_not(backend):
    from schedrl.distributed.workers import pin

    cores = sorted(os.sched_getaffinity(0))
    w = backend.start_worker("w", Toy, "w")
    backend.get(backend.call(w, "record", 0))
    w.pool.submit(pin, [cores[1]], None).result()
    assert backend.get(backend.call(w, "affinity")) == {cores[1]}
    assert os.sched_getaffinity(0) == set(cores)
