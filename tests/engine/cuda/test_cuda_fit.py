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


def _engine(path: Path, **settings):
    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine

    return LLMEngine(EngineConfig(model=str(path), device="cuda", **settings))


def _model(name: str, folder: Path) -> Path:
    import make_random_gguf
    import make_random_hybrid_gguf

    path = folder / f"{name}.gguf"
    if name in make_random_hybrid_gguf.SHAPES:
        make_random_hybrid_gguf.write(name, path)
    else:
        make_random_gguf.write(name, "q4_k_m", path)
    return path


def _check(path: Path, settings: list[dict], caplog) -> list[int]:
    """Each setting's engine allocates the blocks `paddock fit` predicts from the engine's own reading."""
    from app.engine.plan.fit import FitOptions, check_fit, shape_from_checkpoint

    shape, blocks = shape_from_checkpoint(path), []
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
    return blocks


@pytest.mark.parametrize("name", MODELS)
def test_fit_predicts_the_blocks_the_engine_allocates_on_the_gpu(
    cuda, name: str, tmp_path: Path, caplog
) -> None:
    blocks = _check(
        _model(name, tmp_path),
        [dict(max_model_len=128), dict(max_model_len=1024, max_num_seqs=8, kv_dtype="fp8")],
        caplog,
    )
    # 32 sequences of 128 tokens against 8 of 1,024: the second setting's wish is twice the first's (the two
    # once asked for the same 4,096 tokens, and equal counts could not tell the settings apart)
    assert blocks[0] != blocks[1]


def test_fit_predicts_the_blocks_when_the_memory_decides(cuda, tmp_path: Path, caplog) -> None:
    """A Qwen3-0.6B-shaped file asked for 64 sequences of its whole 40,960-token context in 5 % of the card:
    the room, not the sequences' wish, decides the count, and the prediction still equals the allocation."""
    import make_random_gguf

    path = tmp_path / "qwen3-0.6b.gguf"
    make_random_gguf.write("qwen3-0.6b", "q4_k_m", path)
    settings = [
        dict(max_num_seqs=64, gpu_memory_utilization=0.05),
        dict(max_num_seqs=64, gpu_memory_utilization=0.06),
    ]
    blocks = _check(path, settings, caplog)
    assert max(blocks) < 64 * 40960 // 16 + 1 and blocks[0] < blocks[1]
