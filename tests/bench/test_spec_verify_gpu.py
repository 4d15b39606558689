"""bench/lab/spec_verify_gpu.py: the per-position acceptance and the projection it prints, and a whole
run on the CPU with a tiny random Qwen3-shaped file as its own draft model (every greedy draft accepted)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    return _load("spec_verify_gpu", ROOT / "bench" / "lab" / "spec_verify_gpu.py")


def test_per_position_acceptance_and_the_projection(bench) -> None:
    # a step of 4 drafts keeping all, one of 4 keeping 1, one of 2 keeping none
    rates, pooled = bench.per_position([(4, 4), (4, 1), (2, 0)])
    assert rates[:4] == [2 / 3, 1 / 2, 1.0, 1.0] and rates[4:] == [None] * 4  # a_j: kept j / reached j
    assert pooled == pytest.approx(5 / 7)
    c_verify = {2: 1.5, 5: 2.0}
    two = bench.projected(rates, pooled, 0.25, c_verify, 2)
    assert two["expected_tokens"] == pytest.approx(1 + 2 / 3 + 1 / 3)
    assert two["cost_decode_steps"] == pytest.approx(2 * 0.25 + 1.5)
    assert two["speedup"] == pytest.approx(2.0 / 2.0)
    assert two["geometric_speedup"] == pytest.approx((1 + 5 / 7 + (5 / 7) ** 2) / 2.0)
    assert bench.projected(rates, pooled, 0.0, c_verify, 5)["speedup"] is None  # position 5 never reached


def test_a_cpu_run_prints_every_row(bench, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("gguf")
    make = _load("make_random_gguf", ROOT / "bench" / "make_random_gguf.py")
    model = tmp_path / "tiny.gguf"
    make.write("tiny", "q4_k_m", model)
    out = tmp_path / "rows.jsonl"
    bench.main([str(model), "--draft", str(model), "--device", "cpu", "--context", "16", "--tokens", "16",
                "--rounds", "1", "--repeats", "1", "--out", str(out)])  # fmt: skip
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert printed == [json.loads(line) for line in out.read_text().splitlines()]
    rows: dict[str, list[dict]] = {}
    for row in printed:
        rows.setdefault(row["row"], []).append(row)
    assert rows["setup"][0]["backend"] == "cpu"
    costs = {(r["c"], r["k"]): r for r in rows["verify_cost"]}
    assert set(costs) == {(c, k) for c in (1, 8) for k in (0, *range(2, 9))}
    assert all(r["ms"] > 0 and r["path"] == "eager" for r in costs.values())
    assert costs[(8, 4)]["rows"] == 40 and costs[(1, 0)]["decode_steps"] == 1.0
    assert rows["draft_cost"][0]["decode_steps"] > 0
    measured = {r["method"]: r for r in rows["measured"]}
    assert set(measured) == {"off", "ngram", "draft"}
    assert all(r["same_tokens"] for r in measured.values()), measured
    assert measured["draft"]["drafted"] > 0 and measured["draft"]["acceptance"] >= 0.9  # its own drafts
    projected = [r for r in rows["projected"] if r["method"] == "draft"]
    assert [r["k"] for r in projected] == list(range(2, 9))
    for r in projected:
        assert r["cost_decode_steps"] == pytest.approx(r["k"] * r["c_draft"] + r["c_verify"])
        assert r["c_verify"] == pytest.approx(costs[(1, r["k"])]["decode_steps"])
    assert {r["method"] for r in rows["acceptance"]} == {"ngram", "draft"}
