"""One memory model on the GPU: the KV blocks `paddock fit` predicts from the free memory the engine read
before loading are the blocks the engine allocates with the same settings, at several contexts, and the
weights took no more than the plan counts for them (the count from the memory left after loading never had
to cap the prediction). The models are bench/'s random-weight files (heads the CUDA kernels take), written
at test time: a Qwen3-shaped and a Llama-shaped Q4_K_M, and a hybrid Qwen3.5 with its recurrent state."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
MODELS = ["tiny", "tiny-llama", "qwen35-tiny"]
TIGHT_BLOCKS = 1000  # the room a tight setting leaves: fewer blocks than the sequences want


def _engine(path: Path, **settings):
    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine

    return LLMEngine(EngineConfig(model=str(path), device="cuda", **settings))


def _tight_utilization(path: Path, settings: dict) -> float:
    """A --gpu-memory-utilization whose room holds about TIGHT_BLOCKS KV blocks on this card, so the
    memory, not the sequences' wish, decides the count."""
    from app.engine.config import EngineConfig
    from app.engine.plan.device import device_memory
    from app.engine.plan.fit import FitOptions, shape_from_checkpoint
    from app.engine.plan.memory import kv_block_bytes, memory

    shape, free = shape_from_checkpoint(path), device_memory().free_bytes
    options = FitOptions.from_engine(EngineConfig(model=str(path), device="cuda", **settings))
    besides = memory(shape, options, "cuda", free).besides_kv
    return (besides + TIGHT_BLOCKS * kv_block_bytes(shape, options.block_size, "float16")) / free


def _model(name: str, folder: Path) -> Path:
    import make_random_gguf
    import make_random_hybrid_gguf

    path = folder / f"{name}.gguf"
    if name in make_random_hybrid_gguf.SHAPES:
        make_random_hybrid_gguf.write(name, path)
    else:
        make_random_gguf.write(name, "q4_k_m", path)
    return path


@pytest.mark.parametrize("name", MODELS)
def test_fit_predicts_the_blocks_the_engine_allocates_on_the_gpu(
    cuda, name: str, tmp_path: Path, caplog
) -> None:
    from app.engine.plan.fit import FitOptions, check_fit, shape_from_checkpoint

    path = _model(name, tmp_path)

    shape = shape_from_checkpoint(path)
    tight = dict(max_model_len=512, max_num_seqs=64)
    settings = [dict(max_model_len=128), dict(max_model_len=512, max_num_seqs=8, kv_dtype="fp8"), tight]
    settings[-1] = tight | dict(gpu_memory_utilization=_tight_utilization(path, tight))
    blocks = []
    for setting in settings:
        with caplog.at_level(logging.WARNING):
            engine = _engine(path, **setting)
        report = check_fit(shape, FitOptions.from_engine(engine.config), engine.device_memory)
        assert (report.kv_blocks, report.engine_context) == (engine.plan.num_blocks, engine.max_model_len), (
            setting
        )
        assert engine.kv.capacity == engine.plan.num_blocks - 1
        assert "more GPU memory than the plan" not in caplog.text
        blocks.append(engine.plan.num_blocks)
        del engine
    assert blocks[-1] < 64 * 512 // 16 + 1  # the tight setting: the memory decided, not the sequences
    assert len(set(blocks)) == len(blocks)  # each setting changed the count: none is vacuous
