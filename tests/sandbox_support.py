"""What the sandbox tests share: the skip reason, and a check that a run left nothing behind on the host."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from schedrl.sandbox import Sandbox, cgroups
from schedrl.sandbox.sandbox import BASE_DIR, live_processes, unavailable_reason

REASON = unavailable_reason()
needs_sandbox = pytest.mark.skipif(bool(REASON), reason=REASON)


def mounts() -> list[str]:
    return sorted(
        line.split(" - ")[0].split(" ", 4)[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
    )


def confined_box(slot: int):
    """A fixture: a `Sandbox` on `slot` that, after the test, must have left nothing behind."""

    @pytest.fixture
    def box():
        before = mounts()
        b = Sandbox(slot=slot)
        try:
            yield b
            assert_nothing_left(b.uid, before)
        finally:
            b.close()

    return box


def assert_nothing_left(uid: int, before: list[str]) -> None:
    """No process of the uid, no run directory or cgroup of it, and no mount that was not there before."""
    assert not live_processes(uid), "a process survived"
    runs = BASE_DIR / "runs"
    assert not [p for p in runs.iterdir() if p.name.startswith(f"run-{uid}-")], "a run directory survived"
    assert not cgroups.hierarchy().stale(f"run-{uid}-"), "a cgroup survived"
    after = mounts()
    assert after == before, (
        f"mounts changed: +{sorted(set(after) - set(before))} -{sorted(set(before) - set(after))}"
    )


def within(seconds: float, fn, *args, **kwargs):
    """`fn(*args, **kwargs)`, failing the test (not hanging it) if it takes longer than `seconds`."""
    out: list = []

    def call() -> None:
        try:
            out.append((True, fn(*args, **kwargs)))
        except BaseException as err:  # re-raised on the test's thread
            out.append((False, err))

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{getattr(fn, '__name__', fn)} had not returned after {seconds} s"
    ok, value = out[0]
    if not ok:
        raise value
    return value


def run_unheard(box, code: str, server):
    """Run `code` and check that the host's listening `server` (timeout set) heard from nobody; the
    server is closed either way."""
    try:
        result = box.run(code=code)
        with pytest.raises(TimeoutError):
            server.accept()
    finally:
        server.close()
    return result
