"""What the sandbox tests share: the skip reason, and a check that a run left nothing behind on the host."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from schedrl.sandbox import cgroups
from schedrl.sandbox.sandbox import BASE_DIR, live_processes, unavailable_reason

REASON = unavailable_reason()
needs_sandbox = pytest.mark.skipif(bool(REASON), reason=REASON)


def mounts() -> list[str]:
    return sorted(
        line.split(" - ")[0].split(" ", 4)[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
    )


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
