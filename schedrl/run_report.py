"""`schedrl report RUN_DIR` and `schedrl compare RUN ...`: one self-contained HTML page per call.

The page needs no network: every plot is an inline SVG drawn by matplotlib, and a few lines of
inline JavaScript build the table of contents. Each section is a ``<section id=...>`` whose
``data-points`` attribute counts the points plotted in it (what the browser test checks):

* ``rewards``: reward per step and its moving average; ``eval``: held-out pass@1 and greedy
  accuracy over the run;
* ``lengths``: completion-length distribution (p10-p90 band, median, max) per window of steps;
* ``staleness``: the histogram of trained tokens' staleness, and importance-ratio statistics
  (ratio mean and max, clip fraction, approximate KL);
* ``schedulers``: what the schedulers decided: group sizes, domain shares, admission waits,
  tool-wait actions (cached, reused, evicted and expired keys and values per step; tool outcomes so
  far, on a second axis); what carries nothing (one group size throughout, one domain, admission
  waits all 0, a tool-wait count 0 at every step) is left out, and a note under the title says what
  and why;
* ``timeline``: the Gantt chart of what each worker did when, with idle fractions;
* ``throughput``: tokens/s and step time; ``config``: the resolved config.

A section whose metrics a run does not record (staleness in the synchronous loop, tool waits
without tools) says so instead of plotting.
"""

from __future__ import annotations

import html
import io
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schedrl.timeline import TIMELINE_FILE, busy_fractions, read_spans
from schedrl.trace_export import TRACE_FILE, write_trace
from schedrl.training.run_dir import read_metrics

SECTIONS = (
    "rewards", "overoptimisation", "eval", "lengths", "staleness", "schedulers", "timeline", "throughput", "config",
)  # fmt: skip
COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B2", "#937860", "#DA8BC3", "#8C8C8C")
# The engine work of one step's episodes, per step: counter differences over the step's episodes
# (EpisodeRunner.last_stats) and the most tokens cached during them.
TOOL_WAIT_KEYS = ("prefill_tokens", "kv_reused_tokens", "kv_evicted", "kv_expired", "peak_cached_tokens")
# Keys (by prefix) of counters that only grow over a run, drawn apart from the per-step counts:
# `tool/<outcome>` is EpisodeRunner.tool_counts, every tool call's outcome since the run began.
CUMULATIVE_PREFIXES = frozenset({"tool/"})


@dataclass
class Run:
    name: str
    root: Path
    rows: list[dict[str, Any]]  # the step rows of metrics.jsonl
    config_text: str

    @classmethod
    def load(cls, root: str | Path) -> Run:
        root = Path(root)
        metrics = root / "metrics.jsonl"
        if not metrics.is_file():
            raise FileNotFoundError(f"{metrics} is missing; is {root} a schedrl run directory?")
        config = root / "config.yaml"
        return cls(root.name, root, read_metrics(metrics), config.read_text() if config.is_file() else "")

    def series(self, key: str) -> tuple[list[float], list[float]]:
        pts = [(r["step"], float(r[key])) for r in self.rows if isinstance(r.get(key), int | float)]
        return [p[0] for p in pts], [p[1] for p in pts]

    def keys(self, prefix: str) -> list[str]:
        return sorted({k for r in self.rows for k in r if k.startswith(prefix)})


def _svg(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.find("<svg") :]


def _axes(n: int = 1, width: float = 11.0, height: float = 3.4):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, n, figsize=(width, height), squeeze=False)
    return fig, list(axes[0])


def _moving(ys: list[float], w: int) -> list[float]:
    return [statistics.mean(ys[max(0, i - w + 1) : i + 1]) for i in range(len(ys))]


def _lines(
    ax, lines: list[tuple[str, list[float], list[float]]], title: str, ylabel: str, marker: str = ""
) -> int:
    points = 0
    for i, (label, xs, ys) in enumerate(lines):
        if xs:
            ax.plot(
                *((xs, ys, marker) if marker else (xs, ys)),
                color=COLORS[i % len(COLORS)],
                label=label,
                linewidth=1.4,
                markersize=4,
            )
            points += len(xs)
    ax.set(title=title, xlabel="step", ylabel=ylabel)
    ax.grid(alpha=0.3)
    if len(lines) > 1 and points:
        ax.legend(fontsize=8)
    return points


class Section:
    def __init__(self, key: str, title: str, body: str, points: int, note: str = "") -> None:
        self.key, self.title, self.body, self.points, self.note = key, title, body, points, note

    def html(self) -> str:
        note = f"<p class='note'>{html.escape(self.note)}</p>" if self.note else ""
        return (
            f"<section id='{self.key}' data-points='{self.points}'><h2>{html.escape(self.title)}</h2>"
            f"{note}{self.body}</section>"
        )


def _empty(key: str, title: str, why: str) -> Section:
    return Section(key, title, "", 0, why)


def rewards_section(runs: Sequence[Run]) -> Section:
    fig, (ax,) = _axes()
    lines = []
    for run in runs:
        xs, ys = run.series("reward_mean")
        w = max(1, min(len(ys), max(5, len(ys) // 20)))
        lines.append((f"{run.name}: reward (moving average of {w})", xs, _moving(ys, w)))
        if len(runs) == 1:
            lines.append((f"{run.name}: reward per step", xs, ys))
    n = _lines(ax, lines, "training reward", "reward")
    return Section("rewards", "Reward", _svg(fig), n)


def overoptimisation_section(runs: Sequence[Run]) -> Section:
    """A reward model's score and the task's rule reward against KL from the start (Gao et al.'s curve),
    for runs rewarded by a reward model (`task.reward_model`) with a KL term logged."""
    fig, (ax,) = _axes()
    lines = []
    for run in runs:
        models = [k for k in run.keys("rewards/reward_model_") if k.endswith("/mean")]
        if not models or not run.keys("kl"):
            continue
        steps_kl = dict(zip(*run.series("kl"), strict=True))
        for key, label in (
            (models[0], "reward model's score"),
            ("rewards/rule/mean", "rule's reward (true)"),
        ):
            xs, ys = run.series(key)
            pts = sorted((steps_kl[x], y) for x, y in zip(xs, ys, strict=True) if x in steps_kl)
            w = max(1, len(pts) // 20)
            lines.append((f"{run.name}: {label}", [p[0] for p in pts], _moving([p[1] for p in pts], w)))
    n = _lines(ax, lines, "reward against KL from the start (moving averages)", "reward")
    ax.set_xlabel("KL from the start (per token)")
    if not n:
        return _empty(
            "overoptimisation",
            "Over-optimisation",
            "no reward model and KL were logged (task.reward_model, algo.kl_coef)",
        )
    return Section("overoptimisation", "Over-optimisation", _svg(fig), n)


def eval_section(runs: Sequence[Run]) -> Section:
    fig, (ax,) = _axes()
    lines = []
    for run in runs:
        for key in ("eval/pass@1", "eval/greedy_acc", "eval/return_mean"):  # LM runs; classic runs
            xs, ys = run.series(key)
            if xs:
                lines.append((f"{run.name}: {key[5:]}", xs, ys))
    label = "return" if any("return" in name for name, _, _ in lines) else "accuracy"
    n = _lines(ax, lines, "held-out evaluation (step 0: before RL)", label, marker="o-")
    if not n:
        return _empty("eval", "Held-out evaluation", "no evaluation was logged (eval.tasks: 0)")
    return Section("eval", "Held-out evaluation", _svg(fig), n)


def lengths_section(runs: Sequence[Run]) -> Section:
    if len(runs) > 1:
        fig, (ax,) = _axes()
        n = _lines(
            ax, [(r.name, *r.series("completion_len_mean")) for r in runs], "mean completion length", "tokens"
        )
        return Section("lengths", "Completion lengths", _svg(fig), n)
    run = runs[0]
    steps, p50 = run.series("len_p50")
    if not steps:
        xs, ys = run.series("completion_len_mean")
        fig, (ax,) = _axes()
        n = _lines(ax, [("mean", xs, ys)], "mean completion length", "tokens")
        return Section("lengths", "Completion lengths", _svg(fig), n, "this run logged no length quantiles")
    p10, p90, top = run.series("len_p10")[1], run.series("len_p90")[1], run.series("len_max")[1]
    w = max(1, len(steps) // 25)
    windows = [range(i, min(i + w, len(steps))) for i in range(0, len(steps), w)]
    mid = [steps[win[0]] for win in windows]

    def agg(values: list[float], fn) -> list[float]:
        return [fn([values[i] for i in win]) for win in windows]

    fig, (ax,) = _axes()
    ax.fill_between(
        mid,
        agg(p10, statistics.mean),
        agg(p90, statistics.mean),
        color=COLORS[0],
        alpha=0.25,
        label="p10-p90",
    )
    n = _lines(
        ax,
        [("median", mid, agg(p50, statistics.mean)), ("max", mid, agg(top, max))],
        f"completion length per window of {w} steps",
        "tokens",
    )
    ax.legend(fontsize=8)
    return Section("lengths", "Completion lengths", _svg(fig), n + 2 * len(mid))


def staleness_section(runs: Sequence[Run]) -> Section:
    run = runs[0]
    hist_keys = run.keys("staleness_hist/")
    ratio_keys = [k for k in ("ratio_mean", "ratio_max", "clipfrac", "approx_kl") if run.series(k)[0]]
    if not hist_keys and not ratio_keys:
        return _empty(
            "staleness", "Staleness and importance ratios", "no staleness or ratio metrics in this run"
        )
    fig, (left, right) = _axes(2)
    counts = {int(k.split("/")[1]): sum(run.series(k)[1]) for k in hist_keys}
    points = 0
    if counts:
        left.bar(list(counts), list(counts.values()), color=COLORS[0])
        left.set_xticks(sorted(counts))
        points += len(counts)
        left.set(title="trained tokens by staleness (versions behind)", xlabel="staleness", ylabel="tokens")
    else:
        left.text(
            0.5, 0.5, "synchronous loop: every token is on-policy", ha="center", transform=left.transAxes
        )
        left.set_axis_off()
    points += _lines(
        right, [(k, *run.series(k)) for k in ratio_keys], "importance ratio and clipping", "value"
    )
    note = "" if len(runs) == 1 else f"of {run.name}"
    return Section("staleness", "Staleness and importance ratios", _svg(fig), points, note)


def _constant(values: Sequence[float]) -> float | None:
    """The one value every point of `values` has, or None when they differ (or there are none)."""
    return values[0] if values and all(v == values[0] for v in values) else None


def _is_cumulative(key: str) -> bool:
    return key.startswith(tuple(CUMULATIVE_PREFIXES))


def _tool_panel(ax, run: Run, keys: list[str]) -> int:
    """Per-step counts on the left axis; counters that only grow over the run on a second, right axis
    (dashed), so the per-step counts keep a readable scale. The legend sits right of the panel."""
    per_step = [k for k in keys if not _is_cumulative(k)]
    totals = [k for k in keys if _is_cumulative(k)]
    if not per_step:  # only running totals: they own the one axis
        points = _lines(
            ax, [(k, *run.series(k)) for k in totals], "tool calls: totals so far", "total so far"
        )
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
        return points
    points = _lines(ax, [(k, *run.series(k)) for k in per_step], "tool waits", "per step")
    right = ax
    if totals:
        ax.set_title("tool waits: per step (solid, left axis), totals so far (dashed, right axis)")
        right = ax.twinx()
        for i, key in enumerate(totals):
            xs, ys = run.series(key)
            right.plot(
                xs, ys, "--", color=COLORS[(len(per_step) + i) % len(COLORS)], label=key, linewidth=1.4
            )
            points += len(xs)
        right.set_ylabel("total so far")
    if ax.get_legend() is not None:
        ax.get_legend().remove()
    handles, labels = ax.get_legend_handles_labels()
    if totals:
        more = right.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    right.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.1 if totals else 1.01, 1))
    return points


def schedulers_section(runs: Sequence[Run]) -> Section:
    run = runs[0]
    groups = [k for k in ("data/group_size_mean", "data/group_size_max") if run.series(k)[0]]
    domains = run.keys("data/domain/")
    waits = [k for k in ("queue_s_mean",) if run.series(k)[0]]
    tools = [k for k in (*TOOL_WAIT_KEYS, *run.keys("tool/")) if run.series(k)[0]]
    if not (groups or domains or waits or tools):
        return _empty("schedulers", "What the schedulers decided", "no scheduler metrics in this run")
    left_out = []
    size = _constant([y for k in groups for y in run.series(k)[1]])
    if size is not None:
        left_out.append(f"samples per task ({size:g} for every task at every step: nothing decided)")
        groups = []
    if len(domains) == 1:
        left_out.append(f"domain shares (one domain, {domains[0].split('/', 2)[-1]})")
        domains = []
    if waits and _constant([y for k in waits for y in run.series(k)[1]]) == 0:
        left_out.append("admission wait (every wait was 0 s)")
        waits = []
    zeros = [k for k in tools if _constant(run.series(k)[1]) == 0]
    if zeros:
        tools = [k for k in tools if k not in zeros]
        what = "tool waits" if not tools else ", ".join(zeros)
        left_out.append(f"{what} (0 at every step)")
    note = "left out: " + "; ".join(left_out) if left_out else ""

    def shares(key: str) -> tuple[list[float], list[float]]:  # a domain a step gave no sample: 0 there
        rows = [r for r in run.rows if any(k.startswith("data/domain/") for k in r)]
        return [r["step"] for r in rows], [float(r.get(key, 0.0)) for r in rows]

    def milliseconds(key: str) -> tuple[list[float], list[float]]:  # a few microseconds: 0.02, not 2e-5
        xs, ys = run.series(key)
        return xs, [y * 1000.0 for y in ys]

    panels = [
        ("data: samples per task", "samples", [(k, *run.series(k)) for k in groups]),
        ("data: domain shares", "share", [(k, *shares(k)) for k in domains]),
        ("admission: mean wait", "milliseconds", [(k, *milliseconds(k)) for k in waits]),
    ]
    panels = [p for p in panels if p[2]]
    if not panels and not tools:
        return _empty("schedulers", "What the schedulers decided", f"nothing to plot; {note}")
    fig, axes = _axes(len(panels) + bool(tools), height=3.2)
    points = 0
    for ax, (title, ylabel, lines) in zip(axes, panels, strict=False):
        points += _lines(ax, [(k.split("/")[-1], xs, ys) for k, xs, ys in lines], title, ylabel)
        ax.legend(fontsize=7)
    if tools:
        points += _tool_panel(axes[-1], run, tools)
    fig.tight_layout()  # side by side, each panel's y label clear of its neighbour
    return Section("schedulers", "What the schedulers decided", _svg(fig), points, note)


def timeline_section(runs: Sequence[Run]) -> Section:
    from schedrl.gantt import format_fractions, gantt_figure

    run = runs[0]
    path = run.root / TIMELINE_FILE
    spans = read_spans(path) if path.is_file() else []
    if not spans:
        return _empty("timeline", "Timeline", "no timeline in this run directory")
    fractions = busy_fractions(spans)
    table = f"<pre>{html.escape(format_fractions(fractions))}</pre>"
    trace = ""
    if (run.root / TRACE_FILE).is_file():
        trace = (
            f"<p id='trace'>The workers' spans and each episode's model turns, environment calls and waits: "
            f"<a href='{TRACE_FILE}'>{TRACE_FILE}</a> (a Perfetto / Chrome trace: open it in "
            "https://ui.perfetto.dev or chrome://tracing).</p>"
        )
    return Section(
        "timeline",
        "Timeline (what each worker did when)",
        _svg(gantt_figure(spans)) + table + trace,
        len(spans),
    )


def throughput_section(runs: Sequence[Run]) -> Section:
    fig, (left, right) = _axes(2)
    if any(r.series("env_steps_per_s")[0] for r in runs):  # a classic run
        series = [(r.name, *r.series("env_steps_per_s")) for r in runs]
        n = _lines(left, series, "environment steps per second", "steps/s")
    else:
        series = [(r.name, *r.series("tokens_per_s")) for r in runs]
        n = _lines(left, series, "generated tokens per second", "tokens/s")
    n += _lines(right, [(r.name, *r.series("step_s")) for r in runs], "seconds per step", "s")
    return Section("throughput", "Throughput", _svg(fig), n)


def config_section(runs: Sequence[Run]) -> Section:
    body = "".join(
        f"<details {'open' if len(runs) == 1 else ''}><summary>{html.escape(r.name)}</summary>"
        f"<pre>{html.escape(r.config_text)}</pre></details>"
        for r in runs
    )
    return Section("config", "Resolved config", body, sum(bool(r.config_text) for r in runs))


BUILDERS = {
    "rewards": rewards_section,
    "overoptimisation": overoptimisation_section,
    "eval": eval_section,
    "lengths": lengths_section,
    "staleness": staleness_section,
    "schedulers": schedulers_section,
    "timeline": timeline_section,
    "throughput": throughput_section,
    "config": config_section,
}
SCRIPT = """
document.addEventListener("DOMContentLoaded", () => {
  const nav = document.getElementById("toc");
  for (const s of document.querySelectorAll("section")) {
    const a = document.createElement("a");
    a.href = "#" + s.id;
    a.textContent = s.querySelector("h2").textContent + (s.dataset.points === "0" ? " (none)" : "");
    nav.appendChild(a);
  }
  document.body.dataset.ready = "1";
});
"""
STYLE = (
    "body{font-family:sans-serif;margin:1.5em auto;max-width:1150px;color:#222}"
    "#toc a{margin-right:1em}section{margin-top:1.5em;border-top:1px solid #ddd}"
    "pre{background:#f6f6f6;padding:.6em;overflow:auto;font-size:12px}.note{color:#777}"
    "svg{max-width:100%;height:auto}"
)


def render(runs: Sequence[Run], title: str) -> str:
    if not runs:
        raise ValueError("a report needs at least one run directory")
    sections = [BUILDERS[key](runs) for key in SECTIONS]
    summary = ", ".join(f"{r.name}: {sum('reward_mean' in row for row in r.rows)} steps" for r in runs)
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><p>{html.escape(summary)}</p><nav id='toc'></nav>"
        + "".join(s.html() for s in sections)
        + f"<script>{SCRIPT}</script></body></html>"
    )


def write_run_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """The report of one run, `RUN_DIR/report.html` unless `out` is given."""
    run = Run.load(run_dir)
    write_trace(run.root)  # trace.json beside it, linked from the timeline section
    path = Path(out) if out is not None else run.root / "report.html"
    path.write_text(render([run], f"schedrl run {run.name}"), encoding="utf-8")
    return path


def write_compare(run_dirs: Sequence[str | Path], out: str | Path) -> Path:
    """Several runs overlaid on one page (the per-run sections show the first run)."""
    runs = [Run.load(d) for d in run_dirs]
    path = Path(out)
    path.write_text(render(runs, "schedrl compare: " + ", ".join(r.name for r in runs)), encoding="utf-8")
    return path
