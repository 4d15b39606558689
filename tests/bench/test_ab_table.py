"""bench/ab_table.py reads gpu_run.sh's ab logs: headers, result lines, crashed runs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _ab_table():
    spec = importlib.util.spec_from_file_location("ab_table", ROOT / "bench" / "ab_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _result(model: str, batch: int, replay: float, step: float) -> str:
    return json.dumps({"model": model, "batch": batch, "step_ms_p50": step, "graph_replay_ms": replay})


def test_runs_grouped_by_model_batch_and_setting_in_log_order() -> None:
    log = "\n".join([
        "== m:q4 A=0", '{"copy_tb_s": 4.2}', _result("m.gguf", 1, 2.5, 2.6), _result("m.gguf", 32, 6.0, 5.9),
        "== m:q4 A=1", '{"copy_tb_s": 4.2}', "Traceback (most recent call last):", "LaunchError: ...",
        "== m:q4 A=0", '{"copy_tb_s": 4.2}', _result("m.gguf", 1, 2.4, 2.45),
    ])  # fmt: skip
    runs = _ab_table().read_runs(log)
    assert runs[("m:q4", 1)]["A=0"] == [(2.5, 2.6), (2.4, 2.45)]
    assert runs[("m:q4", 32)]["A=0"] == [(6.0, 5.9)]
    assert "A=1" not in runs[("m:q4", 1)]  # crashed: no figure, not a zero


def test_table_of_a_committed_log() -> None:
    module = _ab_table()
    text = (ROOT / "bench" / "results" / "archive" / "ab-min-blocks-2026-11-30-run77.log").read_text()
    table = module.table(module.read_runs(text))
    assert "| qwen3-8b:q4_k_m | 1 | PADDOCK_GEMV_MIN_BLOCKS=2 | 2.400 | 2.437 |" in table
    assert table.count("\n") == 1 + 8  # header rule + 2 models x 2 batches x 2 settings
