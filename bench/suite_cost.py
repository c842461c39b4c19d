"""What the test suite costs: `.ci/run` on a fresh clone, from start to end, environments included.

Clones the repository's HEAD (committed work only) into a temporary folder, runs `time bash .ci/run`
there as CI does, and reports the total and the split that `scripts/test.sh` records per part
(`build/test-logs/seconds.tsv`: each environment, lint/types/docs, each suite). With `--fast` it then
times `scripts/test.sh --fast` in the same clone, its main environment already built. Run it on a quiet
machine: the suite keeps both cores busy, and a second busy process slows it by as much.

    python bench/suite_cost.py            # about 10-15 minutes on 2 cores
    python bench/suite_cost.py --fast     # and the fast tier after it

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = {"full": 20 * 60, "fast": 3 * 60}  # the suite's budgets: a fresh-clone CI run, the fast tier


def timed(cmd: list[str], cwd: Path, log: Path) -> tuple[float, int]:
    """Seconds and exit code of `cmd` in `cwd`, its output in `log`."""
    start = time.perf_counter()
    with log.open("w") as out:
        code = subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT).returncode
    return time.perf_counter() - start, code


def parts(clone: Path) -> dict[str, dict]:
    """The per-part seconds and status that scripts/test.sh wrote."""
    table = clone / "build" / "test-logs" / "seconds.tsv"
    rows = [line.split("\t") for line in table.read_text().splitlines() if line.strip()]
    return {name: {"s": int(seconds), "status": status} for name, seconds, status in rows}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--fast", action="store_true", help="also time scripts/test.sh --fast after the full run"
    )
    parser.add_argument(
        "--keep", default=None, help="clone into this folder (kept) instead of a temporary one"
    )
    args = parser.parse_args()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    with tempfile.TemporaryDirectory(prefix="suite-cost-") as tmp:
        clone = Path(args.keep) if args.keep else Path(tmp) / "schedrl"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        full_s, full_code = timed(["bash", ".ci/run"], clone, Path(tmp) / "ci.log")
        split = parts(clone)
        print(f"fresh clone, bash .ci/run: {full_s:.0f} s (exit {full_code}); budget {TARGET_S['full']} s")
        for name, row in split.items():
            print(f"  {name:<20} {row['s']:>5} s  {row['status']}")
        result = {
            "commit": head.stdout.strip(),
            "full_s": round(full_s),
            "full_exit": full_code,
            "full_vs_budget": round(full_s / TARGET_S["full"], 3),
            "parts_s": {name: row["s"] for name, row in split.items()},
        }
        if args.fast:
            fast_s, fast_code = timed(["bash", "scripts/test.sh", "--fast"], clone, Path(tmp) / "fast.log")
            print(f"scripts/test.sh --fast: {fast_s:.0f} s (exit {fast_code}); budget {TARGET_S['fast']} s")
            result |= {"fast_s": round(fast_s), "fast_exit": fast_code}
        if full_code != 0:
            print((Path(tmp) / "ci.log").read_text()[-3000:], file=sys.stderr)
    print(json.dumps(result))
    return 0 if full_code == 0 and result.get("fast_exit", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
