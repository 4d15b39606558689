"""The fast tier's budget check (.ci/tier_budget.py) on recorded times it is handed: what counts, where it
fails, and the recording itself (tests/conftest.py) in a child pytest."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("tier_budget", ROOT / ".ci" / "tier_budget.py")
tier_budget = importlib.util.module_from_spec(SPEC)  # type: ignore[arg-type]
SPEC.loader.exec_module(tier_budget)  # type: ignore[union-attr]


def write_times(folder: Path, rows_by_worker: dict[str, list[dict]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for worker, rows in rows_by_worker.items():
        (folder / f"{worker}-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def run(test: str, cpu: float, slow: bool = False) -> dict:
    return {"test": test, "slow": slow, "cpu": cpu, "wall": 3 * cpu}  # wall stretched: a busy machine


def start(cpu: float) -> dict:
    return {"test": tier_budget.COLLECTION, "slow": False, "cpu": cpu, "wall": None}


def test_the_estimate_counts_fast_tests_per_worker_and_one_start(tmp_path) -> None:
    times = write_times(tmp_path / "t", {
        "gw0": [start(10), run("a.py::x", 200), run("a.py::y", 1000, slow=True)],
        "gw1": [start(12), run("b.py::z", 180)],
    })  # fmt: skip
    rows = tier_budget.read_times(times)
    assert tier_budget.fast_tier_seconds(rows, workers=2) == (200 + 180) / 2 + 11  # the slow test and wall left out
    assert tier_budget.main([str(times), "--budget", "160", "--factor", "1.25"]) == 1  # 201 s > 200 s
    assert tier_budget.main([str(times), "--budget", "161", "--factor", "1.25"]) == 0  # 201 s <= 201.25 s
    assert tier_budget.main([str(times), "--budget", "201", "--factor", "1.0"]) == 0


def test_no_times_is_an_error_naming_the_folder(tmp_path) -> None:
    with pytest.raises(SystemExit, match="no test times"):
        tier_budget.read_times(write_times(tmp_path / "empty", {"gw0": [start(5)]}))


def test_the_suite_records_each_tests_times(tmp_path) -> None:
    """A child pytest with PADDOCK_TEST_TIMES set writes one line per test and one for its start."""
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tmp_path / "test_two.py").write_text(
        "import pytest\n\ndef test_fast():\n    sum(range(10**5))\n\n@pytest.mark.slow\ndef test_slow():\n    pass\n"
    )
    times = tmp_path / "times"
    env = {**os.environ, "PADDOCK_TEST_TIMES": str(times)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-m", "slow or not slow", str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = tier_budget.read_times(times)
    by_test = {row["test"].split("::")[-1]: row for row in rows}
    assert set(by_test) == {tier_budget.COLLECTION, "test_fast", "test_slow"}
    assert by_test["test_slow"]["slow"] and not by_test["test_fast"]["slow"]
    assert all(row["cpu"] >= 0 for row in rows) and by_test["test_fast"]["wall"] > 0
