"""A run's timeline as a Perfetto / Chrome trace (`trace.json`, the trace-event JSON format): open it in
https://ui.perfetto.dev or chrome://tracing.

One process per worker (the trainer, each engine, the learner, the reward worker) with its spans
(`generate`, `prefill`, `decode`, `reward`, `train`, `weight-sync`, `wait`) on one track; and one process,
`episodes`, with a track per multi-turn episode: its model turns (`turn`, with their token counts), its
environment calls (`env`: reset, each step with its tool calls' outcomes), the time an environment's
answer waited for the runner to take it (`answer-wait`), and inside each turn the engine's phases of its
request (`queued` for admission, `prefill`, `decode`; `timeline.engine_phases`). Times are microseconds
from the run's first span. `schedrl report RUN_DIR` writes it beside the report and links it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from schedrl.timeline import EPISODES_FILE, TIMELINE_FILE, Span, read_spans

TRACE_FILE = "trace.json"
EPISODES_PROCESS = "episodes"


def trace_events(workers: list[Span], episodes: list[Span]) -> list[dict[str, Any]]:
    """The trace-event list: metadata naming processes and threads, then one complete event per span."""
    spans = workers + episodes
    if not spans:
        return []
    t0 = min(s.start for s in spans)
    pids = {w: i + 1 for i, w in enumerate(sorted({s.worker for s in workers}))}
    pids[EPISODES_PROCESS] = len(pids) + 1
    tids = {t: i + 1 for i, t in enumerate(sorted({s.track for s in episodes}))}
    events: list[dict[str, Any]] = []
    for name, pid in pids.items():
        if name != EPISODES_PROCESS or episodes:
            events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
    for track, tid in tids.items():
        args = {"name": track}
        events.append(
            {"ph": "M", "name": "thread_name", "pid": pids[EPISODES_PROCESS], "tid": tid, "args": args}
        )

    def event(s: Span, pid: int, tid: int) -> dict[str, Any]:
        return {
            "ph": "X",
            "name": s.name or s.kind,
            "cat": s.kind,
            "pid": pid,
            "tid": tid,
            "ts": round((s.start - t0) * 1e6, 3),
            "dur": round(max(s.end - s.start, 0.0) * 1e6, 3),
            "args": {"worker": s.worker, **({"episode": s.track} if s.track else {})},
        }

    events += [event(s, pids[s.worker], 0) for s in sorted(workers, key=lambda s: s.start)]
    events += [
        event(s, pids[EPISODES_PROCESS], tids[s.track])
        for s in sorted(episodes, key=lambda s: (s.start, -s.duration))  # a turn before the phases it holds
    ]
    return events


def write_trace(run_dir: str | Path) -> Path | None:
    """`RUN_DIR/trace.json` from its timeline and its episodes' spans; None when it has neither."""
    root = Path(run_dir)
    workers = read_spans(root / TIMELINE_FILE) if (root / TIMELINE_FILE).is_file() else []
    episodes = read_spans(root / EPISODES_FILE) if (root / EPISODES_FILE).is_file() else []
    events = trace_events(workers, episodes)
    if not events:
        return None
    path = root / TRACE_FILE
    path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    return path
