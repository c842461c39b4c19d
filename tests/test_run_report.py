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
from schedrl.cli import main
from schedrl.run_report import SECTIONS

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
            self.current = a["id"]
            self.found[self.current] = {"points": int(a["data-points"]), "plot": False}
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


def test_the_report_holds_every_section_with_data(runs, capsys):
    async_run, sync_run = runs
    assert main(["report", str(async_run)]) == 0
    page = (async_run / "report.html").read_text()
    sections = _parse(page).found
    assert list(sections) == list(SECTIONS)
    for key, s in sections.items():
        assert s["plot"] and s["points"] > 0, (key, s)
    assert not re.search(r"(src|href)=[\"']?https?:", page)  # nothing fetched: no network needed
    # the synchronous loop has no staleness: that section says so instead of plotting nothing
    assert main(["report", str(sync_run)]) == 0
    sync_sections = _parse((sync_run / "report.html").read_text()).found
    assert sync_sections["rewards"]["points"] > 0 and sync_sections["staleness"]["points"] > 0  # its ratios


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
        s["points"] > 0 and s["plot"] for s in parsed.found.values()
    )
    image = Image.open(tmp_path / "shot.png").convert("L")
    assert image.size[0] >= 1000 and ImageStat.Stat(image).stddev[0] > 5, "the screenshot is blank"
    # the console check catches a script error: a page with one fails it
    broken = tmp_path / "broken.html"
    broken.write_text("<html><body><script>undefinedFunction();</script></body></html>")
    _, errors = _browse(broken, tmp_path / "broken.png")
    assert errors, "a script error went unseen"
