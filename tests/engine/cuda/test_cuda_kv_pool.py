"""`--kv-blocks` on the GPU: the engine allocates exactly the pool asked for and serves the context it holds,
and a pool the GPU cannot hold is refused naming the flag before the allocator is asked for it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))


def test_a_fixed_pool_is_allocated_and_one_past_the_gpu_is_refused(cuda, tmp_path) -> None:
    import make_random_gguf

    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine
    from app.engine.sampling_params import SamplingParams

    path = tmp_path / "tiny.gguf"
    make_random_gguf.write("tiny", "q4_k_m", path)
    engine = LLMEngine(EngineConfig(model=str(path), device="cuda", num_kv_blocks=65, max_num_seqs=4))
    assert engine.plan.num_blocks == 65 and engine.kv.capacity == 64
    assert engine.max_model_len == 64 * 16  # the tiny shape's own context is 4,096
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    [result] = engine.generate([list(range(5, 205))], params)
    assert len(result["token_ids"]) == 4 and "error" not in result
    del engine
    with pytest.raises(ValueError, match=r"--kv-blocks 1000000000: .* room for at most"):
        LLMEngine(EngineConfig(model=str(path), device="cuda", num_kv_blocks=10**9, max_num_seqs=4))
