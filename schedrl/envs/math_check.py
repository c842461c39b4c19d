"""Math answers checked by `math-verify`, in a worker process under a hard time limit.

    pip install 'schedrl[math]'

`math_verify.verify(parse(gold), parse(answer))` decides equivalence symbolically: ``7/4``,
``\\frac{7}{4}``, ``1.75`` and ``$\\boxed{\\tfrac74}$`` are the same answer. A mixed number (``1 3/4``),
which the parser would read as a product, is rewritten as a sum first. math-verify's own timeouts
use SIGALRM, which only works on a main thread, and a thread cannot be stopped: so every check runs
in one long-lived worker process, and a check past `timeout_s` kills that process (a new one
starts for the next check) and counts as wrong. Inputs longer than `max_chars` are wrong unread.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import re
import threading
from typing import Any

MIXED = re.compile(r"(?<![\d.])(\d+)\s+(\d+)\s*/\s*(\d+)(?![\d.])")


def normalize(text: str) -> str:
    """Mixed numbers as sums: ``2 1/3`` -> ``(2+1/3)``."""
    return MIXED.sub(r"(\1+\2/\3)", text)


def _serve(conn: Any) -> None:  # the worker process: checks until the pipe closes
    from math_verify import parse, verify

    while True:
        try:
            gold, answer, limit = conn.recv()
        except EOFError:
            return
        try:
            seconds = max(1, int(limit))
            ok = bool(
                verify(
                    parse(gold, parsing_timeout=seconds),
                    parse(answer, parsing_timeout=seconds),
                    timeout_seconds=seconds,
                )
            )
        except Exception:  # an answer math-verify cannot read is wrong, never a crash
            ok = False
        conn.send(ok)


class MathChecker:
    """`check(gold, answer)` -> bool, at most `timeout_s` each; `timeouts` counts the checks cut."""

    def __init__(self, timeout_s: float = 2.0, max_chars: int = 2000) -> None:
        try:
            import math_verify  # noqa: F401 -- only to fail early with the install command
        except ImportError:
            raise ImportError(
                "math answers are checked by math-verify: pip install 'schedrl[math]'"
            ) from None
        self.timeout_s, self.max_chars = timeout_s, max_chars
        self.timeouts = 0
        self._lock = threading.Lock()
        self._proc: Any = None
        self._conn: Any = None
        self._warm = False  # the worker has answered once: its imports are done

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # no fork of a process holding torch threads
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child,), daemon=True)
        self._proc.start()
        child.close()
        self._warm = False

    def check(self, gold: str, answer: str) -> bool:
        if not isinstance(answer, str) or len(answer) > self.max_chars or "\x00" in answer:
            return False
        with self._lock:
            if self._proc is None or not self._proc.is_alive():
                self._start()
            self._conn.send((normalize(gold), normalize(answer), self.timeout_s))
            # the first check waits for the worker's imports as well
            if self._conn.poll(self.timeout_s + (0.0 if self._warm else 30.0)):
                self._warm = True
                try:
                    return bool(self._conn.recv())
                except EOFError:  # the worker died on this input
                    self._proc = None
                    return False
            self.timeouts += 1
            self.close()
            return False

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join()
            self._proc = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter shutdown
            self.close()
