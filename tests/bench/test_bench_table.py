"""bench/suite/bench_table.py: `paddock bench --json` lines, old and agent-era, as one table."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bench_table():
    spec = importlib.util.spec_from_file_location("bench_table", ROOT / "bench" / "suite" / "bench_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_committed_run_from_before_the_agent_fields() -> None:
    lines = (
        (ROOT / "bench" / "results" / "archive" / "gpu-serve-2026-11-30-run86.jsonl").read_text().splitlines()
    )
    rows = _bench_table().table(lines).splitlines()[2:]
    assert rows[2] == "| qwen3-8b-q4_k_m | 1 | 128 | 0 | 1 | 12 | 12.7 ms | - | 2.28 ms | 424 | - |"
    assert len(rows) == 4


def test_agent_run_shows_cached_tokens_per_turn_or_that_they_were_not_reported() -> None:
    run = {
        "model": "m", "concurrency": 8, "input_tokens": 140, "prefix_tokens": 8000, "turns": 2, "requests": 16,
        "ttft_p50_ms": 20.0, "ttft_p99_ms": 41.5, "itl_p50_ms": 4.25, "output_throughput_tok_s": 1234.4,
        "per_turn": [{"cached_tokens_mean": 8000.0}, {"cached_tokens_mean": 8272.0}],
    }  # fmt: skip
    silent = dict(run, per_turn=[{"cached_tokens_mean": None}, {"cached_tokens_mean": None}])
    rows = _bench_table().table(["not json", json.dumps(run), json.dumps(silent)]).splitlines()[2:]
    assert rows == [
        "| m | 8 | 140 | 8000 | 2 | 16 | 20.0 ms | 41.5 ms | 4.25 ms | 1,234 | 8000 / 8272 |",
        "| m | 8 | 140 | 8000 | 2 | 16 | 20.0 ms | 41.5 ms | 4.25 ms | 1,234 | not reported |",
    ]
