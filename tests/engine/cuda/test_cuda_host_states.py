"""worker/host_states.py on the GPU: spills copied on a side stream into pinned rows while the compute stream
goes on, the rows overwritten after `wait_spills` (as a step's saves do), loaded back bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_samples import assert_greedy_agrees

from app.engine.worker.host_states import HostStates

pytestmark = pytest.mark.gpu


def test_cuda_spills_and_loads_round_trip(cuda) -> None:
    import cupy

    rng = np.random.default_rng(0)
    shapes = [(8192, 3), (16, 128, 128), (8192, 3), (16, 128, 128)]  # ~1 MB a row each: copies take a while
    host_arrays = [rng.standard_normal((6, *shape)).astype(np.float32) for shape in shapes]
    arrays = [cuda.from_host(a) for a in host_arrays]
    states = HostStates(cuda, arrays, rows=4)
    states.spill([(4, 3), (5, 0)])
    for a in arrays:  # the step's saves into the spilled rows, ordered after the copies out
        states.wait_spills()
        a[4:6] = -1.0
    states.load([(3, 1), (0, 2)])
    cupy.cuda.Device().synchronize()
    for a, ref in zip(arrays, host_arrays, strict=True):
        got = cuda.to_host(a)
        np.testing.assert_array_equal(got[1], ref[4])
        np.testing.assert_array_equal(got[2], ref[5])
        assert (got[4:6] == -1.0).all()
    np.testing.assert_array_equal(states.view(3, 1), host_arrays[1][4])


def test_cuda_prefix_hit_resumes_from_a_snapshot_spilled_to_host_ram(cuda, tmp_path) -> None:
    """The Qwen3.5 fixture with room for two device snapshots and a host-RAM tier (decode graphs on, async
    decode on): a prefix pushed off the device by another request resumes from host RAM, with the greedy
    tokens of the same prompt computed from scratch (but at a near-tie)."""
    import sys
    from pathlib import Path

    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine
    from app.engine.sampling_params import SamplingParams

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/engine: hybrid_gguf
    from hybrid_gguf import write_qwen_gguf

    fixture = Path(__file__).resolve().parents[2] / "fixtures" / "hybrid" / "qwen35" / "hf"
    path = str(write_qwen_gguf(fixture, "qwen35", tmp_path / "qwen35.gguf"))
    rng = np.random.default_rng(11)
    shared = [int(t) for t in rng.integers(0, 159, 200)]
    first, second = shared + [5] * 20, shared + [9] * 12
    other = [int(t) for t in rng.integers(0, 159, 150)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2)
    fields = dict(model=path, device="cuda", max_model_len=512, max_num_seqs=4, max_num_batched_tokens=64,
                  block_size=16)  # fmt: skip
    expected = LLMEngine(EngineConfig(**fields, enable_prefix_caching=False)).generate([second], params)[0]
    per_sequence = LLMEngine(EngineConfig(**fields)).model_config.state_bytes_per_sequence
    engine = LLMEngine(EngineConfig(**fields, state_snapshot_interval=32, state_snapshot_gb=2.5 * per_sequence / 2**30,
                                    kv_host_gb=64 * per_sequence / 2**30))  # fmt: skip
    state = engine.kv.state
    assert state is not None and state.snapshots.num_rows == 2 and state.host is not None
    engine.generate([first], params)
    engine.generate([other], params)
    got = engine.generate([second], params)[0]
    assert state.host_hits == 1 and got["num_cached_tokens"] >= 192
    assert engine.runner.host_states.bytes_spilled > 0 and engine.runner.host_states.bytes_loaded > 0
    assert_greedy_agrees(got, expected, "resumed from host RAM")
