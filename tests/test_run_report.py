"""`schedrl report` and `schedrl compare`: every section with data, and the page in a real browser."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

import schedrl
from schedrl import run_report
from schedrl.cli import main
from schedrl.run_report import CUMULATIVE_PREFIXES, SECTIONS, TOOL_WAIT_KEYS, Run, Section

ROOT = Path(__file__).resolve().parents[1]
SHORT_ASYNC = {
    "steps": 6,
    "save_every": 0,
    "sft": {"steps": 5},
    "eval": {"tasks": 8, "k": 2},
    "pipeline": {"mode": "async", "backend": "threads"},
    "schedule": {"max_staleness": 1},
    "algo": {"correction": "decoupled"},
}


class _Sections(HTMLParser):
    """Each section's id, data-points and whether it holds an <svg> (or a <pre>)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: dict[str, dict] = {}
        self.current: str | None = None
        self.ready = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body" and a.get("data-ready") == "1":
            self.ready = True
        if tag == "section":
            self.current = a["id"] or ""
            self.found[self.current] = {"points": int(a["data-points"] or 0), "plot": False}
        elif tag in ("svg", "pre") and self.current:
            self.found[self.current]["plot"] = True


def _parse(text: str) -> _Sections:
    p = _Sections()
    p.feed(text)
    return p


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    a = schedrl.train(ROOT / "examples" / "demo.yaml", out_dir=str(out), name="async", **SHORT_ASYNC)
    b = schedrl.train(
        ROOT / "examples" / "demo.yaml",
        out_dir=str(out),
        name="sync",
        **{**SHORT_ASYNC, "pipeline": {"mode": "sync"}, "schedule": {}, "algo": {}},
    )
    return a.run_dir, b.run_dir


@pytest.mark.train
def test_the_report_holds_every_section_with_data(runs, capsys):
    async_run, sync_run = runs
    assert main(["report", str(async_run)]) == 0
    page = (async_run / "report.html").read_text()
    sections = _parse(page).found
    assert list(sections) == list(SECTIONS)
    for key, s in sections.items():
        if (
            key == "overoptimisation"
        ):  # no reward model in this run: the section says so (test_rlhf_demo draws it)
            assert s["points"] == 0 and "no reward model" in page
            continue
        assert s["plot"] and s["points"] > 0, (key, s)
    assert not re.search(r"(src|href)=[\"']?https?:", page)  # nothing fetched: no network needed
    # the synchronous loop has no staleness: that section says so instead of plotting nothing
    assert main(["report", str(sync_run)]) == 0
    sync_sections = _parse((sync_run / "report.html").read_text()).found
    assert sync_sections["rewards"]["points"] > 0 and sync_sections["staleness"]["points"] > 0  # its ratios


@pytest.mark.train
def test_compare_overlays_runs(runs, tmp_path):
    out = tmp_path / "cmp.html"
    assert main(["compare", str(runs[0]), str(runs[1]), "--out", str(out)]) == 0
    page = out.read_text()
    assert "async" in page and "sync" in page
    assert _parse(page).found["rewards"]["points"] >= 12  # both runs' six steps


def _chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def _browse(page: Path, shot: Path) -> tuple[str, list[str]]:
    """The DOM after the page's scripts ran, and the console errors, from headless Chromium; writes a
    screenshot to `shot`."""
    browser = _chromium()
    assert browser is not None
    flags = [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0"]
    url = page.resolve().as_uri()
    dom = subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    subprocess.run(
        [*flags, f"--screenshot={shot}", "--window-size=1200,2400", url], capture_output=True, timeout=120
    )
    errors = [
        line
        for line in dom.stderr.splitlines()
        if "CONSOLE" in line and ("Error" in line or "Uncaught" in line)
    ]
    return dom.stdout, errors


@pytest.mark.train
@pytest.mark.subprocess
def test_the_report_renders_in_a_real_browser_without_console_errors(runs, tmp_path):
    if _chromium() is None:
        if os.environ.get("SCHEDRL_REQUIRE_BROWSER"):  # .ci/run installs Chromium: there it must run
            pytest.fail("Chromium is not installed but SCHEDRL_REQUIRE_BROWSER is set")
        pytest.skip("needs Chromium (.ci/run installs Debian's chromium)")
    from PIL import Image, ImageStat

    main(["report", str(runs[0])])
    dom, errors = _browse(runs[0] / "report.html", tmp_path / "shot.png")
    assert errors == [], errors
    parsed = _parse(dom)
    assert parsed.ready, "the page's script did not run"
    assert set(parsed.found) == set(SECTIONS) and all(
        s["points"] > 0 and s["plot"] for key, s in parsed.found.items() if key != "overoptimisation"
    )  # no reward model in this run
    image = Image.open(tmp_path / "shot.png").convert("L")
    assert image.size[0] >= 1000 and ImageStat.Stat(image).stddev[0] > 5, "the screenshot is blank"
    # the console check catches a script error: a page with one fails it
    broken = tmp_path / "broken.html"
    broken.write_text("<html><body><script>undefinedFunction();</script></body></html>")
    _, errors = _browse(broken, tmp_path / "broken.png")
    assert errors, "a script error went unseen"


@pytest.fixture(scope="module")
def scheduler_runs(tmp_path_factory):
    """A tool run (one group size, one domain, no admission wait; per-step engine counts and running
    totals of tool outcomes) and a data-scheduler run (group sizes and domain shares that vary)."""
    out = tmp_path_factory.mktemp("scheduler_runs")
    short = {"steps": 3, "save_every": 0, "sft": {"steps": 5}, "eval": {"tasks": 4, "k": 1}}
    tools = schedrl.train(ROOT / "examples" / "calc_tools.yaml", out_dir=str(out), name="tools", **short)
    tiered = schedrl.train(
        ROOT / "examples" / "data_scheduler_tiered.yaml",
        out_dir=str(out),
        name="tiered",
        **{**short, "eval": {"tasks": 4, "k": 1, "every": 0}},
    )
    return tools.run_dir, tiered.run_dir


def _schedulers(run: Run, monkeypatch) -> tuple[Section, list]:
    """The section and the axes of its figure (every axes, twins included)."""
    made, axes_of = [], run_report._axes

    def spy(*args, **kwargs):
        fig, axes = axes_of(*args, **kwargs)
        made.append(fig)
        return fig, axes

    monkeypatch.setattr(run_report, "_axes", spy)
    section = run_report.schedulers_section([run])
    return section, [ax for fig in made for ax in fig.axes]


def _labels(ax) -> set[str]:
    return {str(line.get_label()) for line in ax.get_lines()}


PANELS = {
    "samples per task": "data: samples per task",
    "domain shares": "data: domain shares",
    "admission wait": "admission: mean wait",
}


@pytest.mark.train
def test_panels_where_nothing_was_decided_are_left_out_and_named(scheduler_runs, monkeypatch):
    tools_dir, _ = scheduler_runs
    section, axes = _schedulers(Run.load(tools_dir), monkeypatch)
    titles = {ax.get_title() for ax in axes}
    for name, title in PANELS.items():
        assert title not in titles, (name, titles)
        assert name in section.note, (name, section.note)
    assert "8 for every task" in section.note and "one domain, calc" in section.note
    assert section.note.startswith("left out:") and "\n" not in section.note
    # the note is on the page, under the section's title
    assert main(["report", str(tools_dir)]) == 0
    page = (tools_dir / "report.html").read_text()
    found = re.search(r"<section id='schedulers'[^>]*><h2>[^<]*</h2><p class='note'>([^<]*)</p>", page)
    assert found and all(name in found.group(1) for name in PANELS)


@pytest.mark.train
def test_panels_where_the_schedulers_decided_are_drawn(scheduler_runs, monkeypatch):
    _, tiered_dir = scheduler_runs
    run = Run.load(tiered_dir)
    assert len(set(run.series("data/group_size_max")[1])) > 1 and len(run.keys("data/domain/")) > 1
    assert all(run.series("queue_s_mean")[1])
    section, axes = _schedulers(run, monkeypatch)
    titles = {ax.get_title() for ax in axes}
    for name, title in PANELS.items():
        assert title in titles, (name, titles)
        assert name not in section.note
    assert section.points > 0
    # a domain that got no sample at a step has a share of 0 there, not a gap in its line
    (shares,) = [ax for ax in axes if ax.get_title() == "data: domain shares"]
    steps = run.series("data/group_size_max")[0]
    assert all(list(line.get_xdata()) == steps for line in shares.get_lines())
    assert any(0.0 in list(line.get_ydata()) for line in shares.get_lines())


@pytest.mark.train
def test_every_panel_left_out_says_why(scheduler_runs):
    tools_dir, _ = scheduler_runs
    run = Run.load(tools_dir)
    run.rows = [
        {k: v for k, v in row.items() if k not in TOOL_WAIT_KEYS and "tool/" not in k} for row in run.rows
    ]
    section = run_report.schedulers_section([run])
    assert section.points == 0 and section.body == ""
    assert section.note.startswith("nothing to plot") and all(name in section.note for name in PANELS)


@pytest.mark.train
def test_running_totals_get_their_own_axis(scheduler_runs, monkeypatch):
    tools_dir, _ = scheduler_runs
    run = Run.load(tools_dir)
    totals = run.keys("tool/")
    assert totals and all(k.startswith(tuple(CUMULATIVE_PREFIXES)) for k in totals)
    ys = run.series(totals[0])[1]
    assert ys == sorted(ys)  # a running total never falls
    section, axes = _schedulers(run, monkeypatch)
    (per_step,) = [ax for ax in axes if "prefill_tokens" in _labels(ax)]
    (right,) = [ax for ax in axes if set(totals) <= _labels(ax)]
    assert right is not per_step and not any(k.startswith("tool/") for k in _labels(per_step))
    assert right.get_shared_x_axes().joined(right, per_step)  # a twin: same steps, its own y axis
    assert per_step.get_ylabel() == "per step" and right.get_ylabel() == "total so far"
    # counts that were 0 at every step are left out of the panel and named
    for key in ("kv_reused_tokens", "kv_evicted", "kv_expired"):
        assert all(v == 0 for v in run.series(key)[1])
        assert key in section.note and not any(key in _labels(ax) for ax in axes)
