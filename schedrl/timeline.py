"""What each worker did when: spans (worker, kind, start, end) on the wall clock.

Kinds: ``generate`` (a batch of engine steps), ``prefill`` and ``decode`` (one engine
forward, labelled by whether it admitted new prompts), ``train``, ``weight-sync`` and
``wait``. Consecutive spans of one kind on one worker that touch are merged, so a
run of a thousand decode steps is one span. Spans are written to the run directory
as JSONL; ``schedrl report RUN_DIR`` draws them.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from schedrl.types import Timings

TIMELINE_FILE = "timeline.jsonl"  # in the run directory
EPISODES_FILE = "episodes.jsonl"  # the episodes' own spans, beside it (`write_spans`)
KINDS = ("generate", "prefill", "decode", "reward", "train", "weight-sync", "wait")
# an environment call, a model turn, an answer's wait; inside a turn, the engine's phases of its request
EPISODE_KINDS = ("env", "turn", "answer-wait", "queued", "prefill", "decode")
BUSY = frozenset(KINDS) - {"wait"}
MERGE_GAP_S = 1e-3


@dataclass
class Span:
    worker: str
    kind: str
    start: float  # time.time() seconds
    end: float
    track: str = ""  # an episode's spans: its id (a row of its own in the trace); "" for a worker's own
    name: str = ""  # what it was, for the trace: "reset", "step ok,ok", "turn 2"

    @property
    def duration(self) -> float:
        return self.end - self.start


def engine_phases(timings: Timings, start: float, end: float) -> list[tuple[str, float, float]]:
    """A turn's request in the engine as (kind, start, end) on the wall clock: ``queued`` (arrival to
    admission), ``prefill`` (to the first token), ``decode`` (to the last). The engine stamps its own clock;
    its stamps are placed so that `finished` falls at `end`, when the turn came back, and each phase is
    clipped to the turn's span [`start`, `end`], inside which the trace draws it. A phase the engine did
    not stamp, or one of no length, is left out."""
    if timings.finished is None:
        return []
    shift = end - timings.finished
    stamps = [timings.arrival, timings.admitted, timings.first_token, timings.finished]
    out = []
    for kind, a, b in zip(("queued", "prefill", "decode"), stamps, stamps[1:], strict=False):
        if a is None or b is None:
            continue
        lo, hi = max(start, a + shift), min(end, b + shift)
        if hi > lo:
            out.append((kind, lo, hi))
    return out


class Recorder:
    """Collects one worker's spans; `drain()` hands them over and forgets them."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.spans: list[Span] = []

    def add(self, kind: str, start: float, end: float, track: str = "", name: str = "") -> None:
        if kind not in (EPISODE_KINDS if track else KINDS):
            known = EPISODE_KINDS if track else KINDS
            raise ValueError(f"unknown span kind {kind!r}; expected one of {', '.join(known)}")
        if track:  # an episode's spans are never merged
            self.spans.append(Span(self.worker, kind, start, end, track, name))
            return
        last = self.spans[-1] if self.spans else None
        if last is not None and last.kind == kind and 0 <= start - last.end <= MERGE_GAP_S:
            last.end = max(last.end, end)
        else:
            self.spans.append(Span(self.worker, kind, start, end))

    @contextmanager
    def span(self, kind: str) -> Iterator[None]:
        start = time.time()
        try:
            yield
        finally:
            self.add(kind, start, time.time())

    def drain(self) -> list[Span]:
        spans, self.spans = self.spans, []
        return spans


def append_spans(path: Path, spans: Iterable[Span]) -> None:
    with open(path, "a") as f:
        for s in spans:
            f.write(json.dumps(asdict(s)) + "\n")


def write_spans(root: Path, spans: Iterable[Span]) -> None:
    """A run's spans into its directory: the workers' to the timeline, the episodes' to EPISODES_FILE."""
    spans = list(spans)
    append_spans(root / TIMELINE_FILE, [s for s in spans if not s.track])
    episodes = [s for s in spans if s.track]
    if episodes:
        append_spans(root / EPISODES_FILE, episodes)


def read_spans(path: Path) -> list[Span]:
    spans = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                spans.append(Span(**json.loads(line)))
            except (json.JSONDecodeError, TypeError) as e:
                raise ValueError(f"{path}:{n}: not a timeline span ({e}): {line.strip()[:80]!r}") from e
    return spans


def busy_fractions(spans: Iterable[Span]) -> dict[str, dict[str, float]]:
    """Per worker: busy seconds by kind, the idle fraction over the whole run's window
    (`idle_frac`), and the idle fraction between its own first and last busy span
    (`active_idle_frac`).

    The run's window runs from the first span's start to the last span's end over all
    workers, so a worker that starts late or ends early counts that time as idle: in a
    pipeline, the learner waiting for the first batch and the engine done before the
    last update. `active_idle_frac` leaves those out: the gaps in steady state.
    Overlapping busy spans of one worker are counted once.
    """
    spans = list(spans)
    if not spans:
        return {}
    t0, t1 = min(s.start for s in spans), max(s.end for s in spans)
    window = max(t1 - t0, 1e-9)
    out: dict[str, dict[str, float]] = {}
    by_worker: dict[str, list[Span]] = defaultdict(list)
    for s in spans:
        by_worker[s.worker].append(s)
    for worker, ws in sorted(by_worker.items()):
        row: dict[str, float] = defaultdict(float)
        for s in ws:
            row[s.kind] += s.duration
        busy_spans = [(s.start, s.end) for s in ws if s.kind in BUSY]
        busy = _union_length(busy_spans)
        active_idle = 1.0  # a worker with no busy span was never active
        if busy_spans:
            active = max(max(e for _, e in busy_spans) - min(a for a, _ in busy_spans), 1e-9)
            active_idle = 1.0 - busy / active
        out[worker] = {
            **row,
            "busy_s": busy,
            "idle_frac": 1.0 - busy / window,
            "active_idle_frac": active_idle,
        }
    return out


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, -float("inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total
