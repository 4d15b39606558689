"""Will-it-fit for hybrid models: the KV cache of the attention layers only, the recurrent state
rows (a slot per sequence, the prefix cache's snapshots), against what the engine allocates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hybrid_gguf import write_mamba_gguf, write_qwen_gguf  # sibling module: tests/engine is on sys.path

from app.cli import main as paddock
from app.engine import EngineConfig
from app.engine.core.engine import LLMEngine
from app.engine.loader.weights import open_checkpoint
from app.engine.models.registry import model_config
from app.engine.plan.device import GiB
from app.engine.plan.fit import FitOptions, shape_from_checkpoint
from app.engine.plan.memory import memory

HYBRID = Path(__file__).resolve().parents[1] / "fixtures" / "hybrid"
CONTEXT, SEQS = 256, 4
GGUF_ARCH = {"qwen35": "qwen35", "qwen35moe": "qwen35moe", "qwen3next": "qwen3next", "nemotron_h": "nemotron_h",
             "nemotron_h_moe": "nemotron_h_moe", "granite_hybrid": "granitehybrid"}  # fmt: skip


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fit")


def family_gguf(fam: str, folder: Path) -> Path:
    path = folder / f"{fam}.gguf"
    if not path.exists():
        write = write_qwen_gguf if fam.startswith("qwen") else write_mamba_gguf
        write(HYBRID / fam / "hf", GGUF_ARCH[fam], path)
    return path


@pytest.fixture(scope="module")
def qwen35(gguf_dir: Path) -> Path:
    return family_gguf("qwen35", gguf_dir)


def allocated_bytes(engine: LLMEngine) -> int:
    """Bytes of every cache array the engine holds: KV blocks and recurrent state rows."""
    total = 0
    for cache in engine.runner.kv_caches:
        for array in cache or ():
            total += array.nbytes
    return total


@pytest.mark.parametrize("source", ["gguf", "hf"])
@pytest.mark.parametrize("fam", sorted(GGUF_ARCH))
def test_the_shape_counts_attention_layers_and_the_state(fam: str, source: str, gguf_dir: Path) -> None:
    path = family_gguf(fam, gguf_dir) if source == "gguf" else HYBRID / fam / "hf"
    cfg = model_config(open_checkpoint(path))
    shape = shape_from_checkpoint(path)
    assert len(shape.kv_layers) == len(cfg.attention_layers) < shape.num_layers == cfg.num_layers
    assert shape.state_bytes_per_sequence == cfg.state_bytes_per_sequence > 0


@pytest.mark.parametrize(("fam", "snapshot_gb"), [("qwen35", None), ("qwen35", 0.0001), ("qwen35", 0.0),
                                                  ("nemotron_h", None), ("granite_hybrid", 0.0001)])  # fmt: skip
def test_prediction_is_within_5_percent_of_the_engine(fam: str, snapshot_gb: float | None, gguf_dir: Path) -> None:
    path = family_gguf(fam, gguf_dir)
    engine = LLMEngine(EngineConfig(model=str(path), device="cpu", cpu_kernels="numpy", max_model_len=CONTEXT,
                                    max_num_seqs=SEQS, state_snapshot_gb=snapshot_gb))  # fmt: skip
    options = FitOptions(context_length=CONTEXT, batch=SEQS, max_num_seqs=SEQS, state_snapshot_gb=snapshot_gb)
    predicted = memory(shape_from_checkpoint(path), options, "cpu")
    state = engine.kv.state
    assert state is not None
    assert predicted.state_slots == state.slots.num_slots == SEQS
    assert predicted.state_snapshots == state.snapshots.num_rows
    assert predicted.state == engine.plan.state_bytes
    actual = allocated_bytes(engine)
    assert abs(predicted.kv_cache + predicted.state - actual) <= 0.05 * actual
    if snapshot_gb is not None:  # the budget asked for, to within one snapshot
        per_sequence = engine.model_config.state_bytes_per_sequence
        assert 0 <= snapshot_gb * GiB - state.snapshots.num_rows * per_sequence < per_sequence


def test_a_dense_model_has_no_state_line() -> None:
    shape = shape_from_checkpoint(HYBRID.parent / "families" / "llama" / "hf")
    assert shape.kv_layers == () and shape.state_bytes_per_sequence == 0
    assert memory(shape, FitOptions(), "cpu").state == 0


def test_paddock_fit_shows_the_recurrent_state(qwen35: Path, capsys: Any) -> None:
    assert paddock(["fit", str(qwen35), "--ctx", "256", "--max-num-seqs", "4"]) == 0
    out = capsys.readouterr().out
    assert "2 with a KV cache" in out
    assert "4 sequence slots" in out and "prefix-cache snapshots" in out
    assert paddock(["fit", str(qwen35), "--ctx", "256", "--prefix-cache", "off", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["breakdown"]["state_snapshots"] == 0 and report["breakdown"]["state_slots"] == 32
    assert report["breakdown"]["state"] == 33 * report["shape"]["state_bytes_per_sequence"]


@pytest.mark.parametrize("fam", ["qwen35", "nemotron_h"])
def test_the_studio_library_sees_the_state_of_a_hybrid_gguf(fam: str, gguf_dir: Path) -> None:
    """The Studio's model list judges a hybrid file with its recurrent state counted."""
    from app.studio.library import describe_gguf

    path = family_gguf(fam, gguf_dir)
    entry = describe_gguf((path,), path.stem)
    cfg = model_config(open_checkpoint(path))
    assert entry.shape is not None
    assert (len(entry.shape.kv_layers), entry.shape.state_bytes_per_sequence) == (
        len(cfg.attention_layers), cfg.state_bytes_per_sequence
    )
    assert memory(entry.shape, FitOptions(max_num_seqs=SEQS), "cpu").state_slots == SEQS
