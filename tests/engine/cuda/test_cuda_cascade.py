"""Cascade decode attention (kernels/attention_cascade.py) on the GPU: a decode batch whose sequences
share the blocks leading their block tables, against the numpy backend's attention over each whole
context; and the engine's decode graphs replaying the cascade variant for sessions over one cached
prompt, against the numpy backend's tokens."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from cuda_samples import assert_greedy_agrees, rel_err, shared_prefix_case

from app.engine.backend.base import AttentionMetadata, SharedPrefix

pytestmark = pytest.mark.gpu

BLOCK = 16
TC_TOL = 1e-3  # the shared part rounds q and the probabilities to float16 on the tensor cores


def _on_gpu(cuda, q, k_cache, v_cache, meta: AttentionMetadata, shared: int | None):
    xp = cuda.xp
    k_gpu, v_gpu = cuda.alloc_kv_cache(k_cache.shape[0], BLOCK, k_cache.shape[2], k_cache.shape[3])
    k_gpu[...] = xp.asarray(k_cache.astype(np.float16))
    v_gpu[...] = xp.asarray(v_cache.astype(np.float16))
    n = len(meta.seq_lens)
    prefix = None
    if shared is not None:
        prefix = SharedPrefix(xp.asarray([0, n], xp.int32), xp.asarray([shared - 1 + n], xp.int32),
                              xp.asarray([shared], xp.int32))  # fmt: skip
    gpu_meta = AttentionMetadata(
        xp.asarray(meta.query_start_loc), xp.asarray(meta.seq_lens), xp.asarray(meta.block_tables),
        xp.asarray(meta.slot_mapping), xp.asarray(meta.positions), 1, meta.max_seq_len, BLOCK,
        shared_prefix=prefix,
    )  # fmt: skip
    return k_gpu, v_gpu, gpu_meta


@pytest.mark.parametrize(("shared_blocks", "own", "heads"), [
    (500, [140, 268, 150, 200, 141, 199, 260, 170], (32, 8, 128)),  # issue 16's c=8: 8,000 shared keys
    (2000, [1, 900], (32, 8, 128)),  # 32,000 shared keys, one session barely past them
    (40, [5, 64, 300, 1], (4, 1, 256)),  # Gemma 3's global layers: head_dim 256, one KV head
    (37, [20, 3, 3, 90, 8, 1], (12, 4, 64)),  # head_dim 64, group of 3
])  # fmt: skip
@pytest.mark.parametrize(("key_warp_rows", "own_blocks"), [(32, 0), (0, 2)], ids=["key-warps", "row-warps-own2"])
def test_cascade_decode_matches_numpy(
    cuda, cpu, rng, monkeypatch, shared_blocks, own, heads, key_warp_rows, own_blocks
) -> None:  # fmt: skip
    """The shared part on the build whose warps split each tile's keys (every case here has at most 32 rows a KV
    head) and on the default build; the own keys on the plain decode's plan of blocks, and on 2 a pair."""
    options = replace(cuda.kernel_options, cascade_key_warps=key_warp_rows, cascade_own_blocks=own_blocks)
    monkeypatch.setattr(cuda, "kernel_options", options)
    q, k_cache, v_cache, meta = shared_prefix_case(rng, shared_blocks, own, heads, BLOCK)
    scale = heads[2] ** -0.5
    ref = cpu.attention(q, k_cache, v_cache, meta, scale)
    for shared in (shared_blocks * BLOCK, 0, None):  # the whole prefix, none of it, no cascade at all
        k_gpu, v_gpu, gpu_meta = _on_gpu(cuda, q, k_cache, v_cache, meta, shared)
        got = cuda.to_host(cuda.attention(cuda.from_host(q), k_gpu, v_gpu, gpu_meta, scale))
        assert rel_err(got, ref) < TC_TOL, f"shared={shared}"
        # for an output product that reads float16: the same output, rounded as a cast rounds it
        half = cuda.to_host(cuda.attention(cuda.from_host(q), k_gpu, v_gpu, gpu_meta, scale, half_out=True))
        assert half.dtype == np.float16, f"shared={shared}"
        np.testing.assert_array_equal(half, got.astype(np.float16))


def _generate(model: str, device: str, prompts: list[list[int]], warm: list[int]) -> tuple[list[dict], int]:
    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine
    from app.engine.sampling_params import SamplingParams

    engine = LLMEngine(EngineConfig(model=model, device=device, max_model_len=2048, max_num_seqs=16))
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=3)
    engine.generate([warm], params)  # the shared prompt is cached: the sessions' tables share its blocks
    outputs = engine.generate(prompts, params)
    graphs = engine.runner.graphs
    return outputs, 0 if graphs is None else graphs.cascade_steps


def test_sessions_over_one_cached_prompt_decode_on_the_cascade_graphs(tiny_gguf: str, monkeypatch) -> None:
    """Six sessions over one cached 900-token prompt: their decode steps replay the cascade graphs
    (counted), and the tokens match the numpy backend's wherever its top two are not a near-tie; the
    same run without cascade replays none."""
    from app.engine import envs

    rng = np.random.default_rng(5)
    prefix = rng.integers(0, 256, size=900).tolist()
    prompts = [prefix + rng.integers(0, 256, size=n).tolist() for n in (3, 17, 40, 5, 60, 1)]
    reference, _ = _generate(tiny_gguf, "cpu", prompts, prefix)
    for cascade in ("1", "0"):  # on by default since the H100 figures (2026-12-06); off must still work
        monkeypatch.setenv("PADDOCK_CASCADE", cascade)
        envs.reload()
        ours, steps = _generate(tiny_gguf, "cuda", prompts, prefix)
        assert (steps > 0) == (cascade == "1"), steps
        for got, ref in zip(ours, reference, strict=True):
            assert_greedy_agrees(got, ref, f"cascade={cascade}")
    envs.reload()
