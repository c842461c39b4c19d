"""The Gantt chart of a run's timeline and each worker's idle fraction (a part of `schedrl report`, whose
page is `schedrl.run_report`; `schedrl simulate --out DIR` draws a simulated run's).

Writes ``timeline.png`` and ``timeline.html`` (one self-contained file: the chart as
inline SVG, every span with a hover title, and the idle table) into the run directory.
"""

from __future__ import annotations

import html
import io
from pathlib import Path

from schedrl.timeline import TIMELINE_FILE, Span, busy_fractions, read_spans

COLORS = {
    "generate": "#4C72B0",
    "prefill": "#8172B2",
    "decode": "#64B5CD",
    "reward": "#55A868",
    "train": "#DD8452",
    "weight-sync": "#C44E52",
    "wait": "#DDDDDD",
}


def gantt_figure(spans: list[Span]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    t0 = min(s.start for s in spans)
    workers = sorted({s.worker for s in spans})
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.6 * len(workers)))
    for row, worker in enumerate(workers):
        for kind in COLORS:
            bars = [(s.start - t0, s.duration) for s in spans if s.worker == worker and s.kind == kind]
            if bars:
                ax.broken_barh(bars, (row - 0.35, 0.7), facecolors=COLORS[kind])
    ax.set_yticks(range(len(workers)), workers)
    ax.set_xlabel("seconds since the first span")
    kinds = [k for k in COLORS if any(s.kind == k for s in spans)]
    ax.legend(
        handles=[Patch(color=COLORS[k], label=k) for k in kinds],
        loc="lower center",
        bbox_to_anchor=(0.5, 1.0),
        ncol=len(kinds),
        frameon=False,
    )
    fig.tight_layout()
    return fig


def _idle_table(fractions: dict[str, dict[str, float]]) -> list[tuple[str, float, float, float]]:
    return [(w, row["busy_s"], row["idle_frac"], row["active_idle_frac"]) for w, row in fractions.items()]


def write_report(run_dir: str | Path, extra_html: str = "") -> dict[str, dict[str, float]]:
    """Draw the timeline of `run_dir` (with `extra_html`, a section of the page after the chart);
    returns per-worker busy seconds and idle fractions."""
    run_dir = Path(run_dir)
    path = run_dir / TIMELINE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no timeline in this run directory (is it a schedrl run?)")
    spans = read_spans(path)
    if not spans:
        raise ValueError(f"{path}: the timeline is empty")
    fractions = busy_fractions(spans)
    fig = gantt_figure(spans)
    fig.savefig(run_dir / "timeline.png", dpi=120)
    svg = io.StringIO()
    fig.savefig(svg, format="svg")
    import matplotlib.pyplot as plt

    plt.close(fig)
    (run_dir / "timeline.html").write_text(_html(run_dir.name, svg.getvalue(), spans, fractions, extra_html))
    return fractions


def _html(
    title: str, svg: str, spans: list[Span], fractions: dict[str, dict[str, float]], extra_html: str = ""
) -> str:
    t0 = min(s.start for s in spans)
    rows = "".join(
        f"<tr><td>{html.escape(w)}</td><td>{busy:.2f}</td><td>{idle:.1%}</td><td>{active:.1%}</td></tr>"
        for w, busy, idle, active in _idle_table(fractions)
    )
    listing = "".join(
        f"<tr><td>{html.escape(s.worker)}</td><td>{html.escape(s.kind)}</td>"
        f"<td>{s.start - t0:.4f}</td><td>{s.duration * 1e3:.2f}</td></tr>"
        for s in sorted(spans, key=lambda s: s.start)
    )
    svg = svg[svg.find("<svg") :]  # drop the XML prologue: the SVG is inlined
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>schedrl timeline: {html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}details{{margin-top:1em}}</style></head>
<body><h1>Timeline: {html.escape(title)}</h1>{svg}{extra_html}
<h2>Idle fraction per worker</h2>
<p>idle: over the whole run; idle while active: between the worker's first and last busy span.</p>
<table><tr><th>worker</th><th>busy s</th><th>idle</th><th>idle while active</th></tr>{rows}</table>
<details><summary>All {len(spans)} spans</summary>
<table><tr><th>worker</th><th>kind</th><th>start s</th><th>ms</th></tr>{listing}</table></details>
</body></html>
"""


def format_fractions(fractions: dict[str, dict[str, float]]) -> str:
    lines = [f"{'worker':<12} {'busy s':>9} {'idle':>7} {'idle while active':>18}"]
    lines += [
        f"{w:<12} {busy:>9.2f} {idle:>7.1%} {active:>18.1%}"
        for w, busy, idle, active in _idle_table(fractions)
    ]
    return "\n".join(lines)
