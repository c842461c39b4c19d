"""BENCHMARKS.md's claims table, `bench/recheck.py`'s pure functions, and the rules of the benchmark pages
under docs/benchmarks (fast: nothing here runs a benchmark)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLAIMS = ROOT / "BENCHMARKS.md"
PAGES = ROOT / "docs" / "benchmarks"


def _load_recheck():
    spec = importlib.util.spec_from_file_location("bench_recheck", ROOT / "bench" / "recheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


recheck = _load_recheck()


@pytest.fixture(scope="module")
def claims() -> list[dict[str, str]]:
    return recheck.read_claims(CLAIMS)


def _script(command: str) -> Path | None:
    """The bench/ (or examples/) Python file a command runs, if any."""
    match = re.search(r"(?:^|\s)((?:bench|examples)/[\w./-]+\.py)\b", command)
    return ROOT / match.group(1) if match else None


def _runs_schedrl(command: str) -> bool:
    words = [w for w in command.split() if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w)]
    return bool(words) and words[0] == "schedrl"


# --- the table ---------------------------------------------------------------------------------


def test_benchmarks_md_is_short() -> None:
    assert len(CLAIMS.read_text().splitlines()) <= 200


def test_the_table_parses_with_unique_ids(claims) -> None:
    assert claims
    ids = [row["id"] for row in claims]
    assert len(ids) == len(set(ids))
    for row in claims:
        assert set(recheck.MAIN_COLUMNS) <= row.keys()
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", row["id"])


def test_every_command_names_an_existing_script_or_schedrl(claims) -> None:
    for row in claims:
        command = row["command"]
        script = _script(command)
        if script is None:
            assert _runs_schedrl(command), f"{row['id']}: {command!r} names no bench/ file and is not schedrl"
        else:
            assert script.is_file(), f"{row['id']}: {script} does not exist"
        for path in re.findall(r"(?:^|\s)(examples/[\w./-]+\.(?:yaml|py))\b", command):
            assert (ROOT / path).is_file(), f"{row['id']}: {path} does not exist"


def test_every_date_is_a_date(claims) -> None:
    for row in claims:
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", row["date"]), row["id"]
        date.fromisoformat(row["date"])


def test_every_figure_has_a_number(claims) -> None:
    for row in claims:
        recheck.parse_figure(row["figure"])


def test_every_commit_resolves(claims) -> None:
    inside = subprocess.run(
        ["git", "rev-parse", "--is-inside-work-tree"], cwd=ROOT, capture_output=True, text=True
    )
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        pytest.skip("not a git checkout")
    for row in claims:
        done = subprocess.run(["git", "cat-file", "-e", f"{row['commit']}^{{commit}}"], cwd=ROOT)
        assert done.returncode == 0, f"{row['id']}: commit {row['commit']} does not resolve"


def test_quick_rows_name_keys_their_script_prints(claims) -> None:
    quick = [row for row in claims if "json_key" in row]
    assert quick, "no quick rows"
    ids = {row["id"] for row in claims}
    for row in quick:
        assert row["id"] in ids
        assert row["runs"]
        script = _script(row["command"])
        assert script is not None and script.parent.name == "bench", f"{row['id']}: not a bench/ script"
        source = script.read_text()
        for part in row["json_key"].split("."):
            if part.isdigit():
                continue
            assert f'"{part}"' in source or f"'{part}'" in source, (
                f"{row['id']}: {part!r} of {row['json_key']!r} is not a string in {script.name}"
            )


def test_the_table_links_every_page() -> None:
    text = CLAIMS.read_text()
    for page in sorted(PAGES.glob("*.md")):
        assert f"](docs/benchmarks/{page.name})" in text, f"BENCHMARKS.md does not link {page.name}"
    for target in re.findall(r"\]\(([^)#\s]+)", text):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).exists(), f"BENCHMARKS.md links a missing {target}"


# --- recheck's pure functions ------------------------------------------------------------------


def test_parse_figure() -> None:
    assert recheck.parse_figure("1.72x") == 1.72
    assert recheck.parse_figure("16.0%") == 16.0
    assert recheck.parse_figure("1,305x") == 1305.0
    assert recheck.parse_figure("+0.34") == 0.34
    assert recheck.parse_figure("-21.7%") == -21.7
    assert recheck.parse_figure("0.37 s") == 0.37
    assert recheck.parse_figure("1.33x / 1.65x / 2.25x") == 1.33
    assert recheck.parse_figure("60/60") == 60.0
    with pytest.raises(ValueError):
        recheck.parse_figure("n/a")


def test_noise_band() -> None:
    assert recheck.noise_band([2.0, 2.0]) == 0.05  # no spread: the floor
    assert recheck.noise_band([1.0, 1.02]) == 0.05  # 2% spread: the floor
    assert recheck.noise_band([1.0, 1.2, 1.1]) == pytest.approx(0.2 / 1.1)
    assert recheck.noise_band([4.0, 5.0]) == pytest.approx(1.0 / 4.5)
    assert recheck.noise_band([1.0, 1.5], floor=0.6) == 0.6
    assert recheck.noise_band([-1.0, 1.0]) == float("inf")  # median 0 with a spread: no band to hold
    with pytest.raises(ValueError):
        recheck.noise_band([])


def test_moved_decision() -> None:
    assert not recheck.has_moved(2.0, 2.09, 0.05)  # 4.5% off, inside 5%
    assert recheck.has_moved(2.0, 2.11, 0.05)  # 5.5% off
    assert recheck.has_moved(2.0, 1.89, 0.05)  # either way
    assert not recheck.has_moved(2.0, 2.3, 0.2)  # a wide band from noisy repeats
    assert not recheck.has_moved(-10.0, -10.4, 0.05)  # negative claims, relative to |claim|
    assert recheck.has_moved(0.0, 0.1, 0.05) and not recheck.has_moved(0.0, 0.01, 0.05)


def test_assess_and_lookup() -> None:
    row = {"id": "x", "figure": "1.72x"}
    r = recheck.assess(row, [1.70, 1.80])
    assert r == {"id": "x", "claimed": 1.72, "measured": 1.75, "band": round(0.1 / 1.75, 4), "moved": False}
    assert recheck.assess(row, [2.0, 2.02])["moved"]
    out = {"a": {"short": 2.5, "list": [{"v": 3}]}, "flag": True}
    assert recheck.lookup(out, "a.short") == 2.5
    assert recheck.lookup(out, "a.list.0.v") == 3.0
    with pytest.raises(KeyError):
        recheck.lookup(out, "a.long")
    with pytest.raises(ValueError):
        recheck.lookup(out, "flag")


def test_command_argv() -> None:
    argv, env = recheck.command_argv("SCHEDRL_X=1 python bench/dag_sched.py --graphs 5")
    assert argv == [sys.executable, "bench/dag_sched.py", "--graphs", "5"] and env == {"SCHEDRL_X": "1"}


_GOOD = """# t

| id | claim | figure | comparison | command | date | commit | machine |
|---|---|---|---|---|---|---|---|
| a-b | c | 1.5x | d | `python bench/dag_sched.py` | 2026-12-01 | abcdef1 | 2-core VM |
{bad}
## Quick rows

| id | json key | runs |
|---|---|---|
| a-b | `policy_vs_heft_makespan` | about 1 min |
"""


def test_read_claims_on_a_small_table(tmp_path) -> None:
    path = tmp_path / "B.md"
    path.write_text(_GOOD.format(bad=""))
    (row,) = recheck.read_claims(path)
    assert row["command"] == "python bench/dag_sched.py" and row["figure"] == "1.5x"
    assert row["json_key"] == "policy_vs_heft_makespan" and row["runs"] == "about 1 min"


@pytest.mark.parametrize(
    "bad",
    [
        "| c-d | c | 2x | d | `python bench/dag_sched.py` | 2026-12-01 | abcdef1 |",  # a cell short
        "| c-d | c | 2x | d | `python bench/dag_sched.py` | 2026-13-01 | abcdef1 | VM |",  # no such date
        "| c-d | c | 2x | d | python bench/dag_sched.py | 2026-12-01 | abcdef1 | VM |",  # no backticks
        "| c-d | c | none | d | `python bench/dag_sched.py` | 2026-12-01 | abcdef1 | VM |",  # no number
        "| c-d | c | 2x | d | `python bench/dag_sched.py` | 2026-12-01 | xyz | VM |",  # not a hash
        "| C D | c | 2x | d | `python bench/dag_sched.py` | 2026-12-01 | abcdef1 | VM |",  # not kebab-case
        "| a-b | c | 2x | d | `python bench/dag_sched.py` | 2026-12-01 | abcdef1 | VM |",  # id twice
        "| c-d | c | 2x | d | `python bench/dag_sched.py` | 2026-12-01 | abcdef1 | VM",  # no closing bar
    ],
)
def test_a_malformed_row_names_its_line(tmp_path, bad: str) -> None:
    path = tmp_path / "B.md"
    path.write_text(_GOOD.format(bad=bad))
    with pytest.raises(ValueError, match=r"line 6\b"):
        recheck.read_claims(path)


def test_a_quick_row_outside_the_table_names_its_line(tmp_path) -> None:
    path = tmp_path / "B.md"
    path.write_text(_GOOD.format(bad="").replace("| a-b | `policy", "| zz | `policy"))
    with pytest.raises(ValueError, match=r"line 11\b"):
        recheck.read_claims(path)


# --- the benchmark pages -----------------------------------------------------------------------

# (every code block in them is checked with the rest of the docs: tests/test_docs_code.py)


def _pages() -> list[Path]:
    pages = sorted(PAGES.glob("*.md"))
    assert pages, "no docs/benchmarks pages"
    return pages


def test_pages_start_with_a_title_and_link_inside_docs() -> None:
    docs = ROOT / "docs"
    for page in _pages():
        text = page.read_text()
        assert text.startswith("# "), f"{page.name} does not start with a title"
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://", "#")):
                continue
            resolved = (page.parent / target.split("#")[0]).resolve()
            assert resolved.is_relative_to(docs.resolve()), f"{page.name}: {target} leaves docs/"
            assert resolved.exists(), f"{page.name}: {target} does not exist"


def test_every_page_is_in_the_index() -> None:
    index = (PAGES / "index.md").read_text()
    for page in _pages():
        if page.name != "index.md":
            assert f"]({page.name})" in index, f"index.md does not list {page.name}"


def test_every_claim_is_on_a_page(claims) -> None:
    pages = "\n".join(p.read_text() for p in _pages())
    for row in claims:
        assert f"`{row['id']}`" in pages, f"no page names the claim {row['id']}"


# --- README's results table --------------------------------------------------------------------


def _readme_results() -> list[dict[str, str]]:
    lines = (ROOT / "README.md").read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == "## Results"), None)
    assert start is not None, "README.md has no '## Results' section"
    header, rows = None, []
    for line in lines[start + 1 :]:
        if line.startswith("## "):
            break
        if not line.strip().startswith("|"):
            if header is not None:
                break
            continue
        cells = recheck.split_row(line)
        if header is None:
            header = tuple(c.lower() for c in cells)
            assert header == ("id", "claim", "figure", "command", "commit"), header
        elif not all(re.fullmatch(r":?-{3,}:?", c) for c in cells):
            rows.append(dict(zip(header, cells, strict=True)))
    assert header is not None, "README.md's Results section has no table"
    return rows


def test_readme_results_match_the_table(claims) -> None:
    rows = _readme_results()
    assert len(rows) >= 5
    by_id = {row["id"]: row for row in claims}
    for row in rows:
        rid = recheck.unquote(row["id"])
        assert rid in by_id, f"README's {rid} is not in BENCHMARKS.md"
        claim = by_id[rid]
        assert recheck.unquote(row["figure"]) == claim["figure"], rid
        assert recheck.unquote(row["command"]) == claim["command"], rid
        assert recheck.unquote(row["commit"]) == claim["commit"], rid
