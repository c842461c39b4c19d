"""Re-run the quick rows of BENCHMARKS.md and report the figures that moved.

BENCHMARKS.md holds one table of claims (`| id | claim | figure | comparison | command | date | commit |
machine |`) and, under "Quick rows", a second one (`| id | json key | runs |`) naming the rows cheap
enough to re-run and where each command's figure sits in the JSON object it prints as its last line.
This script runs each quick row's command `--repeats` times from the repository root (rows that share
a command share its runs), takes the median of the figure over the repeats, and measures the noise
band from the repeats themselves: their relative spread, (max - min) / median, never below 5%. A row
has moved when its median differs from the claimed figure by more than that band, relative to the
claim.

    python bench/recheck.py --list                      # the claims, quick rows marked
    python bench/recheck.py                             # every quick row, twice
    python bench/recheck.py --only dag-vs-heft --repeats 3

It prints a table, then as its last line one JSON object:
{"rows": [{"id", "claimed", "measured", "band", "moved"}, ...], "moved": [ids]}; a row whose command
failed has "measured": null and an "error", and is listed under "failed". The exit status is 0 when
nothing moved or failed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
from datetime import date
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MAIN_COLUMNS = ("id", "claim", "figure", "comparison", "command", "date", "commit", "machine")
QUICK_COLUMNS = ("id", "json key", "runs")
NOISE_FLOOR = 0.05
ID_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
COMMIT_RE = re.compile(r"^[0-9a-f]{7,40}$")
NUMBER_RE = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?|[-+]?\.\d+")
ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def split_row(line: str) -> list[str]:
    """The cells of a Markdown table row (`\\|` is a literal bar inside a cell)."""
    body = line.strip()
    if not (body.startswith("|") and body.endswith("|")):
        raise ValueError("not a table row")
    cells = re.split(r"(?<!\\)\|", body[1:-1])
    return [c.strip().replace("\\|", "|") for c in cells]


def unquote(cell: str) -> str:
    """A cell without the backticks around it."""
    if len(cell) >= 2 and cell.startswith("`") and cell.endswith("`"):
        return cell[1:-1].strip()
    return cell


def parse_figure(figure: str) -> float:
    """The first number in a figure cell: `1.72x` -> 1.72, `16.0%` -> 16.0, `1,305x` -> 1305.0."""
    match = NUMBER_RE.search(figure.replace("\u2212", "-"))
    if match is None:
        raise ValueError(f"no number in the figure {figure!r}")
    return float(match.group().replace(",", ""))


def noise_band(values: list[float], floor: float = NOISE_FLOOR) -> float:
    """The repeats' relative spread, (max - min) / |median|, never below `floor`."""
    if not values:
        raise ValueError("no values")
    spread = max(values) - min(values)
    if spread == 0:
        return floor
    median = statistics.median(values)
    if median == 0:
        return float("inf")
    return max(floor, spread / abs(median))


def has_moved(claimed: float, measured: float, band: float) -> bool:
    """Whether `measured` differs from `claimed` by more than `band` of the claim (an absolute
    difference of more than `band` where the claim is 0)."""
    if claimed == 0:
        return abs(measured) > band
    return abs(measured - claimed) > band * abs(claimed)


def lookup(obj: Any, key: str) -> float:
    """The number at a dotted path (`a.b`, list indices as numbers) in a JSON object."""
    for part in key.split("."):
        if isinstance(obj, list) and part.isdigit():
            obj = obj[int(part)]
        elif isinstance(obj, dict) and part in obj:
            obj = obj[part]
        else:
            raise KeyError(f"{key!r}: no {part!r}")
    if isinstance(obj, bool) or not isinstance(obj, int | float):
        raise ValueError(f"{key!r} is {obj!r}, not a number")
    return float(obj)


def _check_main(row: dict[str, str], where: str) -> None:
    if not ID_RE.match(row["id"]):
        raise ValueError(f"{where}: id {row['id']!r} is not kebab-case")
    for col in MAIN_COLUMNS:
        if not row[col]:
            raise ValueError(f"{where}: empty {col!r}")
    try:
        date.fromisoformat(row["date"])
    except ValueError:
        raise ValueError(f"{where}: date {row['date']!r} is not YYYY-MM-DD") from None
    if not COMMIT_RE.match(row["commit"]):
        raise ValueError(f"{where}: commit {row['commit']!r} is not a hex hash")
    try:
        parse_figure(row["figure"])
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def read_claims(path: str | Path) -> list[dict[str, str]]:
    """The main table's rows as dicts of its columns (the command and figure without backticks), with
    `json_key` and `runs` added to the quick rows. A malformed row is a ValueError naming its line."""
    lines = Path(path).read_text().splitlines()
    tables: dict[tuple[str, ...], list[tuple[int, list[str]]]] = {}
    header: tuple[str, ...] | None = None
    for n, line in enumerate(lines, start=1):
        if not line.strip().startswith("|"):
            header = None
            continue
        try:
            cells = split_row(line)
        except ValueError:
            raise ValueError(f"{path}, line {n}: a table row must start and end with '|'") from None
        if header is None:
            header = tuple(c.lower() for c in cells)
            if header in tables:
                raise ValueError(f"{path}, line {n}: a second table with the columns {header}")
            tables[header] = []
            continue
        if all(re.fullmatch(r":?-{3,}:?", c) for c in cells):
            continue
        if len(cells) != len(header):
            raise ValueError(f"{path}, line {n}: {len(cells)} cells, the table has {len(header)} columns")
        tables[header].append((n, cells))
    if MAIN_COLUMNS not in tables:
        raise ValueError(f"{path}: no table with the columns | {' | '.join(MAIN_COLUMNS)} |")
    claims: dict[str, dict[str, str]] = {}
    for n, cells in tables[MAIN_COLUMNS]:
        row: dict[str, str] = dict(zip(MAIN_COLUMNS, cells, strict=True))
        where = f"{path}, line {n}"
        if not (row["command"].startswith("`") and row["command"].endswith("`")):
            raise ValueError(f"{where}: the command must be in backticks")
        row["command"] = unquote(row["command"])
        row["figure"] = unquote(row["figure"])
        _check_main(row, where)
        if row["id"] in claims:
            raise ValueError(f"{where}: id {row['id']!r} appears twice")
        claims[row["id"]] = row
    for n, cells in tables.get(QUICK_COLUMNS, []):
        rid, key, runs = cells[0], unquote(cells[1]), cells[2]
        where = f"{path}, line {n}"
        if rid not in claims:
            raise ValueError(f"{where}: quick row {rid!r} is not in the main table")
        if "json_key" in claims[rid]:
            raise ValueError(f"{where}: quick row {rid!r} appears twice")
        if not key or not runs:
            raise ValueError(f"{where}: empty json key or runs")
        claims[rid] |= {"json_key": key, "runs": runs}
    return list(claims.values())


def command_argv(command: str) -> tuple[list[str], dict[str, str]]:
    """The argv and extra environment of a table command (`VAR=value python ...`; `python` is this
    interpreter)."""
    words = shlex.split(command)
    env: dict[str, str] = {}
    while words and ENV_RE.match(words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    if not words:
        raise ValueError(f"empty command {command!r}")
    if words[0] in ("python", "python3"):
        words[0] = sys.executable
    return words, env


def run_once(command: str, timeout: float) -> dict:
    """Run a command from the repository root; the JSON object on its last line of output."""
    argv, extra = command_argv(command)
    done = subprocess.run(
        argv, cwd=ROOT, env={**os.environ, **extra}, capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        raise RuntimeError(f"exit {done.returncode}: {done.stderr.strip()[-500:]}")
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    if not lines:
        raise RuntimeError("no output")
    return json.loads(lines[-1])


def assess(row: dict[str, str], values: list[float]) -> dict:
    """A report row: the claimed figure, the median measured, the noise band and whether it moved."""
    claimed = parse_figure(row["figure"])
    measured = statistics.median(values)
    band = noise_band(values)
    return {
        "id": row["id"],
        "claimed": claimed,
        "measured": round(measured, 6),
        "band": round(band, 4),
        "moved": has_moved(claimed, measured, band),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", action="store_true", help="print the claims and exit")
    ap.add_argument("--only", nargs="+", metavar="ID", help="re-run these quick rows only")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each command (default 2)")
    ap.add_argument("--claims", type=Path, default=ROOT / "BENCHMARKS.md")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds a run may take")
    args = ap.parse_args()
    claims = read_claims(args.claims)
    if args.list:
        for row in claims:
            quick = f"quick: {row['json_key']}" if "json_key" in row else ""
            print(f"{row['id']:<28} {row['figure']:<24} {quick}")
            print(f"{'':<28} {row['command']}")
        return 0
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    quick = [row for row in claims if "json_key" in row]
    if args.only:
        known = {row["id"]: row for row in claims}
        unknown = [i for i in args.only if i not in known]
        slow = [i for i in args.only if i in known and "json_key" not in known[i]]
        if unknown or slow:
            ap.error(f"not quick rows: {', '.join(unknown + slow)}")
        quick = [row for row in quick if row["id"] in args.only]
    outputs: dict[str, list[dict] | str] = {}
    for command in dict.fromkeys(row["command"] for row in quick):
        runs: list[dict] = []
        try:
            for i in range(args.repeats):
                print(f"[{i + 1}/{args.repeats}] {command}", file=sys.stderr, flush=True)
                runs.append(run_once(command, args.timeout))
            outputs[command] = runs
        except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError, ValueError) as e:
            outputs[command] = f"{type(e).__name__}: {e}"
    report, failed = [], []
    for row in quick:
        out = outputs[row["command"]]
        try:
            if isinstance(out, str):
                raise RuntimeError(out)
            report.append(assess(row, [lookup(o, row["json_key"]) for o in out]))
        except (RuntimeError, KeyError, ValueError) as e:
            failed.append(row["id"])
            report.append(
                {
                    "id": row["id"],
                    "claimed": parse_figure(row["figure"]),
                    "measured": None,
                    "band": None,
                    "moved": None,
                    "error": str(e),
                }
            )
    print(f"{'id':<28}{'claimed':>12}{'measured':>12}{'band':>8}  moved")
    for r in report:
        if r["measured"] is None:
            print(f"{r['id']:<28}{r['claimed']:>12.4g}{'-':>12}{'-':>8}  failed: {r['error'][:60]}")
        else:
            print(
                f"{r['id']:<28}{r['claimed']:>12.4g}{r['measured']:>12.4g}{r['band']:>8.1%}  "
                f"{'MOVED' if r['moved'] else 'no'}"
            )
    moved = [r["id"] for r in report if r["moved"]]
    summary: dict[str, Any] = {"rows": report, "moved": moved}
    if failed:
        summary["failed"] = failed
    print(json.dumps(summary))
    return 1 if moved or failed else 0


if __name__ == "__main__":
    sys.exit(main())
