"""bench/lab/host_cost.py past the 32 sequences it once stopped at: the decode rows issue 38's curve asks for
(64-256 sequences) run the graph path, every sequence a one-token chunk of a bucket that holds them all."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def host_cost():
    spec = importlib.util.spec_from_file_location("host_cost", ROOT / "bench" / "lab" / "host_cost.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["host_cost"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("batch", [1, 65])
def test_a_decode_row_runs_the_graph_path_at_any_batch(host_cost, batch: int) -> None:
    row = host_cost.bench_decode(batch, context=96, max_model_len=4096, steps=3)
    assert set(row) == {"schedule_us", "update_us", "runner_graph_us", "graphs_run_us", "eager_metadata_us"}
    assert all(value > 0 for value in row.values())
    assert host_cost.host_graphs(4096, max_batch=batch).bucket_for(batch) is not None
