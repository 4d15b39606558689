"""FP8 KV on the GPU (for the GPU machine): the CUDA writers against fp8_kv.Fp8KvCache.write byte for
byte, the three attention kernels over FP8 caches against the numpy backend's attention over the same
caches, the offload payloads in the numpy layout, and the engine with kv_dtype fp8 against numpy."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_samples import assert_greedy_agrees, rel_err, rope_tables

from app.engine.backend.base import AttentionMetadata
from app.engine.backend.kv_blocks import block_nbytes

pytestmark = pytest.mark.gpu

BLOCK = 16
TOL = 1e-4
TC_TOL = 1e-3  # the tensor-core prefill kernel: q and probabilities rounded to float16


def _same_cache(cuda, gpu, ref) -> None:
    np.testing.assert_array_equal(cuda.to_host(gpu.data), ref.data)
    np.testing.assert_array_equal(cuda.to_host(gpu.scale), ref.scale)


def test_write_kv_matches_numpy_bytes_and_scales(cuda, cpu, rng) -> None:
    """A prefill across blocks, decode steps whose values grow (a block's scale rises and it is
    re-encoded) and a padding slot: the caches equal the numpy backend's after every write."""
    n_kv, head_dim = 4, 128
    kg, vg = cuda.alloc_kv_cache(8, BLOCK, n_kv, head_dim, "fp8")
    kc, vc = cpu.alloc_kv_cache(8, BLOCK, n_kv, head_dim, "fp8")
    steps = [np.concatenate([3 * BLOCK + np.arange(BLOCK), 5 * BLOCK + np.arange(4)]),
             np.array([5 * BLOCK + 4, 6 * BLOCK]), np.array([5 * BLOCK + 5, 6 * BLOCK + 1, -1])]  # fmt: skip
    for i, slots in enumerate(steps):
        k, v = (rng.standard_normal((len(slots), n_kv, head_dim)).astype(np.float32) * 8.0**i for _ in range(2))
        cuda.write_kv(kg, vg, cuda.from_host(k), cuda.from_host(v), cuda.from_host(slots.astype(np.int32)))
        keep = slots >= 0
        cpu.write_kv(kc, vc, k[keep], v[keep], slots[keep])
        _same_cache(cuda, kg, kc)
        _same_cache(cuda, vg, vc)


def test_rope_and_cache_fp8_matches_numpy(cuda, cpu, rng) -> None:
    n_tok, n_heads, n_kv, head_dim, max_pos = 20, 8, 2, 128, 64
    table = rope_tables(head_dim, max_pos)
    qkv = rng.standard_normal((n_tok, (n_heads + 2 * n_kv) * head_dim)).astype(np.float32)
    pos = np.arange(n_tok, dtype=np.int32)
    slots = (2 * BLOCK + pos).astype(np.int32)  # one sequence from a block's start, across two blocks
    kg, vg = cuda.alloc_kv_cache(4, BLOCK, n_kv, head_dim, "fp8")
    kc, vc = cpu.alloc_kv_cache(4, BLOCK, n_kv, head_dim, "fp8")
    q_ref = cpu.rope_and_cache(qkv, n_heads, n_kv, head_dim, None, None, 1e-6, pos, cpu.rope_table(*table), False,
                               kc, vc, slots)  # fmt: skip
    q = cuda.rope_and_cache(cuda.from_host(qkv), n_heads, n_kv, head_dim, None, None, 1e-6, cuda.from_host(pos),
                            cuda.rope_table(*table), False, kg, vg, cuda.from_host(slots))  # fmt: skip
    assert rel_err(cuda.to_host(q), q_ref) < 1e-6
    _same_cache(cuda, vg, vc)  # v as it came: the same bytes
    k_got = cuda.to_host(kg.data).astype(np.int16)  # k after the rotation: at most one e4m3 step apart
    assert np.abs(k_got - kc.data.astype(np.int16)).max() <= 1
    np.testing.assert_array_equal(cuda.to_host(kg.scale), kc.scale)


def _fp8_batch(cuda, cpu, rng, seqs, heads):
    """FP8 caches (the same writes on both backends, values of different sizes per sequence) and q."""
    n_heads, n_kv, head_dim = heads
    per_seq = [-(-ctx // BLOCK) for _, ctx in seqs]
    order = rng.permutation(sum(per_seq) + 3)
    tables = np.zeros((len(seqs), max(per_seq)), np.int32)
    gpu = cuda.alloc_kv_cache(len(order), BLOCK, n_kv, head_dim, "fp8")
    ref = cpu.alloc_kv_cache(len(order), BLOCK, n_kv, head_dim, "fp8")
    used = 0
    for i, (_, ctx) in enumerate(seqs):
        tables[i, : per_seq[i]] = order[used : used + per_seq[i]]
        used += per_seq[i]
        slots = (tables[i, np.arange(ctx) // BLOCK] * BLOCK + np.arange(ctx) % BLOCK).astype(np.int32)
        k, v = (rng.standard_normal((ctx, n_kv, head_dim)).astype(np.float32) * 2.0 ** (i - 2) for _ in range(2))
        cpu.write_kv(*ref, k, v, slots)
        cuda.write_kv(*gpu, cuda.from_host(k), cuda.from_host(v), cuda.from_host(slots))
    qsl = np.concatenate([[0], np.cumsum([n for n, _ in seqs])]).astype(np.int32)
    seq_lens = np.array([ctx for _, ctx in seqs], np.int32)
    positions = np.concatenate([np.arange(ctx - n, ctx) for n, ctx in seqs]).astype(np.int32)
    q = rng.standard_normal((int(qsl[-1]), n_heads, head_dim)).astype(np.float32)

    def meta(put):
        return AttentionMetadata(put(qsl), put(seq_lens), put(tables), put(np.zeros(len(q), np.int32)),
                                 put(positions), max(n for n, _ in seqs), int(seq_lens.max()), BLOCK, qsl,
                                 seq_lens)  # fmt: skip

    return q, ref, gpu, meta(np.asarray), meta(cuda.from_host)


@pytest.mark.parametrize("tensor_cores", [True, False], ids=["prefill_tc", "simt"])
@pytest.mark.parametrize(("seqs", "heads", "window", "cap"), [
    ([(1, 1), (1, 17), (1, 300), (1, 1000)], (32, 8, 128), None, None),  # decode: attention_decode.cu
    ([(37, 37), (5, 5)], (4, 1, 256), None, None),  # prefill
    ([(1, 513), (20, 300), (64, 64)], (12, 4, 64), 100, None),  # mixed, sliding window
    ([(1, 200), (9, 90)], (16, 2, 128), None, 30.0),  # softcap
])  # fmt: skip
def test_attention_over_fp8_matches_numpy(cuda, cpu, rng, seqs, heads, window, cap, tensor_cores) -> None:
    q, (kc, vc), (kg, vg), mc, mg = _fp8_batch(cuda, cpu, rng, seqs, heads)
    scale = heads[2] ** -0.5
    before = cuda.tensor_core_prefill
    cuda.tensor_core_prefill = tensor_cores
    try:
        got = cuda.to_host(cuda.attention(cuda.from_host(q), kg, vg, mg, scale, window, cap))
    finally:
        cuda.tensor_core_prefill = before
    ref = cpu.attention(q, kc, vc, mc, scale, window, cap)
    decode_only = all(n == 1 for n, _ in seqs)
    assert rel_err(got, ref) < (TOL if decode_only or not tensor_cores else TC_TOL)


def test_fp8_block_payloads_match_the_numpy_layout(cuda, cpu, rng) -> None:
    gpu = [cuda.alloc_kv_cache(6, BLOCK, 2, 64, "fp8") for _ in range(2)]
    for layer in gpu:
        for cache in layer:
            cache.data[...] = cuda.from_host(rng.integers(0, 0x7F, cache.data.shape).astype(np.uint8))
            cache.scale[...] = cuda.from_host(np.exp2(rng.integers(-8, 4, cache.scale.shape)).astype(np.float32))
    host = [tuple(type(c)(cuda.to_host(c.data), cuda.to_host(c.scale)) for c in layer) for layer in gpu]
    rows = cuda.alloc_host_blocks(2, block_nbytes(gpu))
    cuda.read_kv_blocks(gpu, [4, 1], rows)
    cuda.sync_kv_copies()
    expected = cpu.alloc_host_blocks(2, block_nbytes(host))
    cpu.read_kv_blocks(host, [4, 1], expected)
    np.testing.assert_array_equal(rows, expected)
    cuda.write_kv_blocks(gpu, [0, 2], rows)
    np.testing.assert_array_equal(cuda.to_host(gpu[1][0].data)[[0, 2]], host[1][0].data[[4, 1]])
    np.testing.assert_array_equal(cuda.to_host(gpu[1][1].scale)[[0, 2]], host[1][1].scale[[4, 1]])


def test_engine_with_fp8_kv_matches_numpy_fp8(tiny_gguf: str) -> None:
    """The whole engine with kv_dtype fp8 (decode graphs and eager) against the numpy backend's FP8
    cache: greedy tokens agree but at near-ties, first-step logprobs within 0.05."""
    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine
    from app.engine.sampling_params import SamplingParams

    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 256, size=n).tolist() for n in (3, 17, 40, 130, 300)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=3)

    def generate(device: str, graphs: bool) -> list[dict]:
        config = EngineConfig(model=tiny_gguf, device=device, max_model_len=1024, max_num_seqs=8, cuda_graphs=graphs,
                              kv_dtype="fp8")  # fmt: skip
        return LLMEngine(config).generate(prompts, params)

    reference = generate("cpu", False)
    for graphs in (True, False):
        for got, ref in zip(generate("cuda", graphs), reference, strict=True):
            for token, value in ref["logprobs"][0].top:
                assert abs(dict(got["logprobs"][0].top).get(token, -99.0) - value) < 5e-2
            assert_greedy_agrees(got, ref, f"fp8 graphs={graphs}")
