"""One memory model: the KV blocks `paddock fit` predicts are the blocks the engine allocates with the same
settings, for every fixture family (GGUF, and the same model's Hugging Face folder read by `paddock fit`)
and the embedded Gemma, at several contexts (CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main as paddock
from app.engine.config import EngineConfig
from app.engine.core.engine import LLMEngine
from app.engine.loader.gguf import read_gguf_header
from app.engine.plan.fit import FitOptions, check_fit, cpu_memory, shape_from_checkpoint, shape_from_gguf

FAMILIES = Path(__file__).resolve().parents[1] / "fixtures" / "families"
GGUFS = sorted(FAMILIES.glob("*/*.gguf"))
# the families whose Hugging Face folder holds the same model as their GGUF (gemma3's is another size)
SAME_MODEL_HF = {"gpt-oss", "granite", "llama", "qwen2", "qwen3", "qwen3moe"}
# contexts the model's own (512), under a step, a few blocks; budgets that cap the blocks or not
SETTINGS = [
    dict(),
    dict(max_model_len=100, kv_cache_bytes=1 << 20),
    dict(max_model_len=16, max_num_seqs=2),
    dict(max_model_len=300, kv_cache_bytes=3 << 20, kv_dtype="fp8", max_num_seqs=4),
    dict(max_model_len=200, block_size=32, kv_cache_bytes=1 << 19),
]


def engine_for(model: str, settings: dict) -> LLMEngine:
    return LLMEngine(EngineConfig(model=model, device="cpu", cpu_kernels="numpy", **settings))


@pytest.mark.parametrize("path", GGUFS, ids=lambda p: p.parent.name)
def test_fit_predicts_the_blocks_the_engine_allocates(path: Path) -> None:
    shape = shape_from_checkpoint(path)
    shapes = [shape]
    if path.parent.name in SAME_MODEL_HF:  # the same model, read from config.json by the family's HF parser
        shapes.append(shape_from_checkpoint(path.parent / "hf"))
    seen = set()
    for settings in SETTINGS:
        engine = engine_for(str(path), settings)
        for predicted in shapes:
            report = check_fit(predicted, FitOptions.from_engine(engine.config), cpu_memory())
            assert (report.kv_blocks, report.engine_context) == (engine.plan.num_blocks, engine.max_model_len), (
                settings
            )
        assert engine.kv.capacity == engine.plan.num_blocks - 1  # the pool's null block
        seen.add(engine.plan.num_blocks)
    assert len(seen) == len(SETTINGS)  # each setting changed the count: none of them is vacuous


@pytest.mark.parametrize("path", GGUFS, ids=lambda p: p.parent.name)
def test_the_studios_header_only_shape_predicts_the_same_blocks(path: Path) -> None:
    """The Studio reads a GGUF's header alone (its folder listing, a hub file before download)."""
    with path.open("rb") as stream:
        _, meta, _ = read_gguf_header(stream)
    header_shape = shape_from_gguf(meta, weight_bytes=path.stat().st_size)
    loaded = shape_from_checkpoint(path)
    assert (header_shape.num_layers, header_shape.num_kv_heads, header_shape.head_dim, header_shape.num_experts) == (
        loaded.num_layers, loaded.num_kv_heads, loaded.head_dim, loaded.num_experts)  # fmt: skip
    for settings in SETTINGS[1:3]:
        engine = engine_for(str(path), settings)
        report = check_fit(header_shape, FitOptions.from_engine(engine.config), cpu_memory())
        assert (report.kv_blocks, report.engine_context) == (engine.plan.num_blocks, engine.max_model_len)


def test_paddock_fit_cli_reports_the_engines_blocks(capsys) -> None:
    """The command itself, on the embedded Gemma at its default settings and a short context."""
    for ctx in (None, 4096):
        engine = engine_for("default", {"max_model_len": ctx} if ctx else {})
        args = ["fit", "default", "--device", "cpu", "--json"] + (["--ctx", str(ctx)] if ctx else [])
        assert paddock(args) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["kv_blocks"] == engine.plan.num_blocks and report["engine_context"] == engine.max_model_len
    assert report["kv_blocks"] < 32 * 4096 // 16 + 1  # the 2 GiB budget capped this one


def test_fit_counts_recurrent_state_in_the_room() -> None:
    """A hybrid model's state rows (the null row, a slot per sequence, the prefix cache's snapshots:
    a fifth of the room here, 1 MiB / 5 = one 128 KiB row) are memory the KV blocks cannot have."""
    from dataclasses import replace

    shape = shape_from_checkpoint(GGUFS[0])
    options = FitOptions(context_length=512, kv_cache_bytes=1 << 20, max_num_seqs=4)
    plain = check_fit(shape, options, cpu_memory())
    hybrid = check_fit(replace(shape, state_bytes_per_sequence=1 << 17), options, cpu_memory())
    rows = 1 + 4 + 1
    assert (hybrid.breakdown.state_slots, hybrid.breakdown.state_snapshots) == (4, 1)
    assert hybrid.breakdown.state == rows << 17
    assert hybrid.breakdown.total == plain.breakdown.total + (rows << 17)
    assert hybrid.kv_blocks < plain.kv_blocks
