#!/usr/bin/env python3
"""Does the fast tier hold its budget? Read the per-test times a `make test` run recorded
(PADDOCK_TEST_TIMES, one JSON line per test: tests/conftest.py) and estimate what `make test-fast`
would take on the CI machine, from the full run's own figures.

The estimate is CPU time, not wall time: on a shared 2-core machine other jobs stretch every wall
clock (the fast tier took 229 s quiet and 450 s at load 5-7), but not the CPU seconds the tests
themselves use. With the tests on as many workers as cores, both busy, the tier's wall time is about

    (CPU of the fast tests + each worker's start and collection) / workers

On a quiet machine that is the wall time: the full suite's fresh-clone runs of 2026-12-03 used 1168
CPU-s for 604 s of pytest on 2 workers (bench/results/make-test-2026-12-03.txt). On a busy one it is
not stretched: `make test-fast` at load 13-14 took 1137 s of pytest and 323 CPU-s, an estimate of 157 s.
Waits that use no CPU (sleeps, timeouts) are not counted: the estimate is a floor for those tests,
which is why the suite waits on events rather than on clocks. A module fixture counts with the test that builds it: in the
full run that may be a slow test, whose fixture the fast tier alone would build itself. Exit status 1 when the estimate is over
`--factor` x `--budget` (the fast tier's goal, 240 s, and 1.25: noise never fails CI, a real slide does).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

COLLECTION = "<start and collection>"


def read_times(folder: Path) -> list[dict]:
    rows = [json.loads(line) for path in sorted(folder.glob("*.jsonl")) for line in path.read_text().splitlines()]
    if not any(row["test"] != COLLECTION for row in rows):
        raise SystemExit(f"tier_budget: no test times in {folder} (was PADDOCK_TEST_TIMES set for the run?)")
    return rows


def fast_tier_seconds(rows: list[dict], workers: int) -> float:
    """The fast tier's estimated pytest time on `workers` busy workers."""
    starts = [row["cpu"] for row in rows if row["test"] == COLLECTION]
    per_worker_start = sum(starts) / len(starts) if starts else 0.0
    fast = sum(row["cpu"] for row in rows if row["test"] != COLLECTION and not row["slow"])
    return fast / workers + per_worker_start


def report(rows: list[dict], top: int) -> str:
    """The fast tier's heaviest files and tests, CPU seconds (wall seconds beside them)."""
    files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    tests = [row for row in rows if row["test"] != COLLECTION and not row["slow"]]
    for row in tests:
        entry = files[row["test"].split("::")[0]]
        entry[0] += row["cpu"]
        entry[1] += row["wall"]
    lines = [f"fast tier: {len(tests)} tests, {sum(r['cpu'] for r in tests):.0f} CPU-s; heaviest files:"]
    for name, (cpu, wall) in sorted(files.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"  {cpu:7.1f} CPU-s {wall:7.1f} s  {name}")
    lines.append("heaviest tests:")
    for row in sorted(tests, key=lambda r: -r["cpu"])[:top]:
        lines.append(f"  {row['cpu']:7.1f} CPU-s {row['wall']:7.1f} s  {row['test']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("times", type=Path, help="the folder PADDOCK_TEST_TIMES named")
    parser.add_argument("--budget", type=float, default=240.0, help="the fast tier's goal, seconds of pytest")
    parser.add_argument("--factor", type=float, default=1.25, help="how far over the goal fails")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers of `make test-fast`")
    parser.add_argument("--top", type=int, default=10, help="files and tests listed")
    args = parser.parse_args(argv)
    rows = read_times(args.times)
    estimate = fast_tier_seconds(rows, max(args.workers, 1))
    print(report(rows, args.top))
    limit = args.factor * args.budget
    verdict = "over" if estimate > limit else "within"
    print(f"fast tier estimate: {estimate:.0f} s of pytest on {args.workers} workers, {verdict} "
          f"{args.factor:g} x its {args.budget:g} s budget ({limit:g} s)")  # fmt: skip
    return 1 if estimate > limit else 0


if __name__ == "__main__":
    sys.exit(main())
