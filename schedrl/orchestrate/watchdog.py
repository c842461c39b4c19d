"""The synchronous loop's watchdog: a phase (the engine's generation, the learner's update, the weight
push) that runs past `pipeline.worker_timeout_s` is named with the stack of the loop's thread.

The asynchronous pipeline bounds every call it waits on (`backend.get`, `backend.wait`); the
synchronous loop runs engine, learner and scorer in its own thread, so nothing there would notice a
hang. `Watchdog` is a thread of its own that watches the phase the loop is in. Past its time it logs
the message and, when the loop is the main thread, interrupts it (SIGINT, which also breaks a blocking
system call); the phase then raises `WorkerStuckError` with the message, and the run stops on its last
checkpoint. A loop on another thread, or one stuck where no signal reaches it, is still named in the
log: nothing hangs silently.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

from schedrl.distributed import WorkerStuckError

log = logging.getLogger(__name__)


class Watchdog:
    """`with watchdog.phase("learner", "update of step 3"):` -- past `timeout_s` (None or 0: never) the
    phase is named, with where the loop's thread is."""

    def __init__(self, timeout_s: float | None) -> None:
        self.timeout_s = timeout_s or None
        self.fired: str | None = None  # the message, once a phase ran past its time
        self._cond = threading.Condition()
        self._phase: tuple[int, str, str, float, int] | None = None  # (serial, worker, what, start, thread)
        self._serial = 0
        self._closed = False
        self._thread: threading.Thread | None = None

    @contextmanager
    def phase(self, worker: str, what: str) -> Iterator[None]:
        if self.timeout_s is None:
            yield
            return
        with self._cond:
            self._serial += 1
            self._phase = (self._serial, worker, what, time.monotonic(), threading.get_ident())
            self._cond.notify()
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="schedrl-watchdog", daemon=True)
            self._thread.start()
        try:
            yield
        except KeyboardInterrupt:
            if self.fired is not None:  # the interrupt was the watchdog's
                raise WorkerStuckError(self.fired) from None
            raise
        finally:
            with self._cond:
                self._phase = None
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _watch(self) -> None:
        assert self.timeout_s is not None
        with self._cond:
            while not self._closed:
                if self._phase is None:
                    self._cond.wait()
                    continue
                serial, worker, what, start, ident = self._phase
                left = start + self.timeout_s - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self._fire(worker, what, ident)
                while self._phase is not None and self._phase[0] == serial and not self._closed:
                    self._cond.wait()  # one message per phase

    def _fire(self, worker: str, what: str, ident: int) -> None:
        frame = sys._current_frames().get(ident)
        where = "".join(traceback.format_stack(frame)) if frame is not None else "(its thread has ended)"
        self.fired = (
            f"stuck: no answer from {worker} ({what}) for {self.timeout_s:g} s (pipeline.worker_timeout_s); "
            f"where the loop is:\n{where}the run stops; `schedrl train --resume` continues from its last "
            "checkpoint"
        )
        log.error("%s", self.fired)
        main = threading.main_thread()
        if ident == main.ident and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.pthread_kill(ident, signal.SIGINT)  # raises KeyboardInterrupt in the phase
        elif ident == main.ident:
            log.error(
                "the phase is not interrupted: SIGINT has a handler of its own (%r), not Python's default",
                signal.getsignal(signal.SIGINT),
            )
