"""Paged attention against the numpy backend: mixed batches, GQA, windows, soft cap, splits.

The numpy reference reads float32 caches holding the same float16-rounded keys and
values the GPU cache holds, so the comparison measures the kernel, not the cache format.
"""

from __future__ import annotations

import numpy as np
import pytest
from cuda_samples import rel_err, rope_tables

from app.engine.backend.base import AttentionMetadata

pytestmark = pytest.mark.gpu

TOL = 1e-4
# The tensor-core prefill kernel (attention_prefill.cu) rounds q and the probabilities to float16 on
# their way into the tensor cores: float16 rounding, not float32 reordering.
TC_TOL = 1e-3
BLOCK_SIZE = 16
HEADS = [(4, 1, 256), (32, 8, 128), (8, 8, 64), (12, 4, 64), (16, 2, 128), (32, 2, 128),
         # attention.cu's alone (every batch kind): the tiny test models' heads, Gemma 4 31B's global layers
         (4, 2, 16), (16, 1, 32), (32, 4, 512)]  # fmt: skip
BATCHES = {
    "decode": [(1, 1), (1, 17), (1, 300), (1, 1000)],
    "prefill": [(37, 37), (5, 5)],
    "mixed": [(1, 513), (20, 300), (64, 64), (1, 2)],
}


def make_batch(cuda, cpu, rng, seqs, n_heads, n_kv, head_dim):
    """Caches filled for every sequence's context, block tables over shuffled blocks, and q."""
    blocks_per_seq = [-(-ctx // BLOCK_SIZE) for _, ctx in seqs]
    num_blocks = sum(blocks_per_seq) + 3
    order = rng.permutation(num_blocks)
    tables = np.zeros((len(seqs), max(blocks_per_seq)), np.int32)
    k_cpu = np.zeros((num_blocks, BLOCK_SIZE, n_kv, head_dim), np.float32)
    v_cpu = np.zeros_like(k_cpu)
    k_gpu, v_gpu = cuda.alloc_kv_cache(num_blocks, BLOCK_SIZE, n_kv, head_dim)
    used = 0
    for i, (_, ctx) in enumerate(seqs):
        tables[i, : blocks_per_seq[i]] = order[used : used + blocks_per_seq[i]]
        used += blocks_per_seq[i]
        slots = (tables[i, np.arange(ctx) // BLOCK_SIZE] * BLOCK_SIZE + np.arange(ctx) % BLOCK_SIZE).astype(
            np.int32
        )
        k = rng.standard_normal((ctx, n_kv, head_dim)).astype(np.float16).astype(np.float32)
        v = rng.standard_normal((ctx, n_kv, head_dim)).astype(np.float16).astype(np.float32)
        cpu.write_kv(k_cpu, v_cpu, k, v, slots)
        cuda.write_kv(k_gpu, v_gpu, cuda.from_host(k), cuda.from_host(v), cuda.from_host(slots))
    qsl = np.concatenate([[0], np.cumsum([n_q for n_q, _ in seqs])]).astype(np.int32)
    seq_lens = np.array([ctx for _, ctx in seqs], np.int32)
    n_tok = int(qsl[-1])
    positions = np.concatenate([np.arange(ctx - n_q, ctx) for n_q, ctx in seqs]).astype(np.int32)
    q = rng.standard_normal((n_tok, n_heads, head_dim)).astype(np.float32)

    def meta(xp_from):
        return AttentionMetadata(
            query_start_loc=xp_from(qsl), seq_lens=xp_from(seq_lens), block_tables=xp_from(tables),
            slot_mapping=xp_from(np.zeros(n_tok, np.int32)), positions=xp_from(positions),
            max_query_len=max(n_q for n_q, _ in seqs), max_seq_len=int(seq_lens.max()), block_size=BLOCK_SIZE,
            host_query_start_loc=qsl, host_seq_lens=seq_lens,
        )  # fmt: skip

    return q, (k_cpu, v_cpu, meta(np.asarray)), (k_gpu, v_gpu, meta(cuda.from_host))


@pytest.fixture(params=["tensor_cores", "simt"])
def prefill_kernel(request, cuda):
    """Prefill and mixed batches through either kernel; decode-only batches take attention_decode either way."""
    before = cuda.tensor_core_prefill
    cuda.tensor_core_prefill = request.param == "tensor_cores"
    yield request.param
    cuda.tensor_core_prefill = before


def check(cuda, cpu, rng, seqs, heads, window=None, cap=None, num_splits=None, q_scale=1.0):
    n_heads, n_kv, head_dim = heads
    q, (kc, vc, mc), (kg, vg, mg) = make_batch(cuda, cpu, rng, seqs, n_heads, n_kv, head_dim)
    q = q * np.float32(q_scale)
    scale = head_dim**-0.5
    ref = cpu.attention(q, kc, vc, mc, scale, window, cap)
    got = cuda.to_host(
        cuda.attention(cuda.from_host(q), kg, vg, mg, scale, window, cap, num_splits=num_splits)
    )
    assert got.shape == ref.shape
    assert not np.isnan(got).any()
    decode_only = all(n_q == 1 for n_q, _ in seqs) and num_splits is None
    assert rel_err(got, ref) < (TOL if decode_only or not cuda.tensor_core_prefill else TC_TOL)


@pytest.mark.parametrize("batch", sorted(BATCHES))
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"h{h[0]}kv{h[1]}d{h[2]}")
def test_attention_matches_numpy(cuda, cpu, rng, prefill_kernel, heads, batch: str) -> None:
    check(cuda, cpu, rng, BATCHES[batch], heads)


@pytest.mark.parametrize("num_splits", [None, 1, 4])  # None: decode batches on attention_decode.cu
@pytest.mark.parametrize("window", [None, 128])  # GPT-OSS alternates full and 128-key windowed layers
@pytest.mark.parametrize("batch", ["decode", "mixed"])
@pytest.mark.parametrize("heads", [(64, 8, 64), (32, 8, 128)], ids=["gpt-oss", "d128"])
def test_attention_sinks_match_numpy(cuda, cpu, rng, heads, batch: str, window, num_splits) -> None:
    """GPT-OSS's attention sinks (one more logit per head in the softmax's denominator) on both
    kernels, split or not, some far above the scores."""
    n_heads, n_kv, head_dim = heads
    q, (kc, vc, mc), (kg, vg, mg) = make_batch(cuda, cpu, rng, BATCHES[batch], n_heads, n_kv, head_dim)
    sinks = rng.normal(0.0, 2.0, n_heads).astype(np.float32)
    sinks[::7] += 12.0
    scale = head_dim**-0.5
    ref = cpu.attention(q, kc, vc, mc, scale, window, None, sinks=sinks)
    got = cuda.to_host(cuda.attention(cuda.from_host(q), kg, vg, mg, scale, window, None, num_splits=num_splits,
                                      sinks=cuda.from_host(sinks)))  # fmt: skip
    assert not np.isnan(got).any()
    decode_only = batch == "decode" and num_splits is None
    assert rel_err(got, ref) < (TOL if decode_only else TC_TOL)


@pytest.mark.parametrize("num_splits", [1, 3, 8, 64])  # 64: mostly empty splits, as in a decode graph
@pytest.mark.parametrize("batch", ["decode", "mixed"])
def test_attention_forced_splits(cuda, cpu, rng, prefill_kernel, batch: str, num_splits: int) -> None:
    check(cuda, cpu, rng, BATCHES[batch], (32, 8, 128), num_splits=num_splits)


@pytest.mark.parametrize("num_splits", [None, 1, 4])
@pytest.mark.parametrize("heads", [(4, 1, 256), (16, 8, 128)], ids=["gemma", "qwen"])
def test_attention_sliding_window(cuda, cpu, rng, prefill_kernel, heads, num_splits) -> None:
    check(cuda, cpu, rng, BATCHES["mixed"], heads, window=32, num_splits=num_splits)
    check(cuda, cpu, rng, [(1, 700), (30, 600)], heads, window=512, num_splits=num_splits)


@pytest.mark.parametrize("num_splits", [None, 3])
def test_attention_of_512_wide_heads_with_window_and_softcap(cuda, cpu, rng, num_splits) -> None:
    """Gemma 4's global layers (512-wide heads, soft-capped as its sliding ones are not) and a window."""
    check(cuda, cpu, rng, BATCHES["mixed"], (16, 2, 512), cap=30.0, q_scale=4.0, num_splits=num_splits)
    check(cuda, cpu, rng, BATCHES["decode"], (8, 1, 512), window=64, num_splits=num_splits)


@pytest.mark.parametrize("batch", ["decode", "mixed"])
def test_attention_softcap(cuda, cpu, rng, prefill_kernel, batch: str) -> None:
    # Larger queries push the scores into tanh's curved range, where the cap matters.
    check(cuda, cpu, rng, BATCHES[batch], (8, 4, 128), cap=5.0, q_scale=4.0)
    check(cuda, cpu, rng, BATCHES[batch], (8, 4, 128), cap=50.0, window=100, q_scale=4.0, num_splits=3)


def test_attention_long_context_auto_splits(cuda, cpu, rng) -> None:
    check(cuda, cpu, rng, [(1, 4096), (1, 5000)], (32, 8, 128))


@pytest.mark.parametrize("heads", [(32, 8, 128), (4, 1, 256), (16, 16, 64), (28, 4, 128)],
                         ids=["qwen3-8b", "gemma3", "d64-mha", "qwen2-7b"])  # fmt: skip
@pytest.mark.parametrize("seqs", [[(140, 8140)], [(128, 32000)], [(1024, 6000)], [(37, 32000), (1, 16000), (300, 300)]],
                         ids=["cache-hit-8k", "chunk-at-32k", "chunk-1k-at-6k", "mixed-32k"])  # fmt: skip
def test_tensor_core_prefill_long_contexts(cuda, cpu, rng, heads, seqs) -> None:
    """The agent workload's shapes: a short chunk over a long cached prefix (split-KV), chunks at up
    to 32k tokens of context, a mixed batch; every GQA ratio the families use."""
    check(cuda, cpu, rng, seqs, heads)
    check(cuda, cpu, rng, seqs, heads, window=4096)


@pytest.mark.parametrize("heads", [(16, 16, 64), (32, 8, 128), (4, 1, 256), (16, 2, 512)],
                         ids=lambda h: f"d{h[2]}")  # fmt: skip
def test_tensor_core_prefill_double_buffered_v(cuda, cpu, rng, monkeypatch, heads) -> None:
    """The PF_VBUF=2 build (V a tile ahead in a second buffer): the cp.async groups it keeps in flight, which
    the emulator's synchronous copies cannot check, on a split long context and a windowed mixed batch."""
    from app.engine import envs

    before = cuda.tensor_core_prefill
    monkeypatch.setenv("PADDOCK_KERNEL_DEFINES", "PF_VBUF=2")
    envs.reload()
    try:
        cuda.tensor_core_prefill = True
        check(cuda, cpu, rng, [(140, 8140)], heads)
        check(cuda, cpu, rng, BATCHES["mixed"], heads, window=100, num_splits=3)
    finally:
        cuda.tensor_core_prefill = before
        monkeypatch.delenv("PADDOCK_KERNEL_DEFINES")
        envs.reload()


def test_attention_poisoned_output_fully_written(cuda, rng) -> None:
    import cupy

    from app.engine.kernels import attention as kernels

    seqs = BATCHES["mixed"]
    q, _, (kg, vg, mg) = make_batch(cuda, cuda_cpu_stub(), rng, seqs, 32, 8, 128)
    for plan in (kernels.SplitPlan(1, kernels.NO_SPLIT), kernels.SplitPlan(5, 128)):
        out = cupy.full(q.shape, cupy.nan, cupy.float32)
        kernels.attention(cuda.from_host(q), kg, vg, mg.query_start_loc, mg.seq_lens, mg.block_tables,
                          0.1, None, None, plan, out)  # fmt: skip
        assert not bool(cupy.isnan(out).any())


def cuda_cpu_stub():
    from app.engine.backend.cpu import CpuBackend

    return CpuBackend()


@pytest.mark.parametrize("heads", [(32, 8, 128), (4, 1, 256)], ids=["qwen", "gemma"])
def test_attention_register_capped_variant(cuda, cpu, rng, heads) -> None:
    """The min_blocks=4 build (128 registers, a few spilled) computes the same function."""
    from app.engine.kernels import attention as kernels

    n_heads, n_kv, head_dim = heads
    q, (kc, vc, mc), (kg, vg, mg) = make_batch(cuda, cpu, rng, BATCHES["mixed"], n_heads, n_kv, head_dim)
    ref = cpu.attention(q, kc, vc, mc, 0.1)
    for plan in (kernels.SplitPlan(1, kernels.NO_SPLIT), kernels.SplitPlan(3, 200)):
        out = cuda.xp.full(q.shape, cuda.xp.nan, cuda.xp.float32)
        kernels.attention(cuda.from_host(q), kg, vg, mg.query_start_loc, mg.seq_lens, mg.block_tables,
                          0.1, None, None, plan, out, min_blocks=4)  # fmt: skip
        assert rel_err(cuda.to_host(out), ref) < TOL


DECODE_HEADS = [(32, 8, 128), (4, 1, 256), (12, 4, 64)]


def decode_contexts(head_dim: int) -> list[int]:
    """One sequence per case: 1 to 8 chunks (at most one cluster's), chunk edges, and 9+ chunks
    (several clusters, or blocks that loop)."""
    from app.engine.kernels.attention_decode import chunk_keys

    kb = chunk_keys(head_dim)
    within_one_cluster = [c * kb - kb // 3 for c in range(1, 9)]  # 1..8 chunks, the last one partly filled
    return [1, kb, kb + 1, *within_one_cluster, 8 * kb, 8 * kb + 1, 700, 2000]


def check_decode(cuda, cpu, rng, heads, n_blocks: int, windows=(None, 100, 300), clusters: bool = True) -> None:
    """attention_decode.attention_decode at `n_blocks` against the numpy backend, every output element
    written; one launch per window, on the same counters (each launch must leave them at zero)."""
    from app.engine.kernels import attention_decode

    n_heads, n_kv, head_dim = heads
    seqs = [(1, ctx) for ctx in decode_contexts(head_dim)]
    q, (kc, vc, mc), (kg, vg, mg) = make_batch(cuda, cpu, rng, seqs, n_heads, n_kv, head_dim)
    for window in windows:
        ref = cpu.attention(q, kc, vc, mc, 0.1, window)
        out = cuda.xp.full(q.shape, cuda.xp.nan, cuda.xp.float32)
        attention_decode.attention_decode(cuda.from_host(q), kg, vg, mg.seq_lens, mg.block_tables, 0.1, window, None,
                                          n_blocks, out, clusters)  # fmt: skip
        got = cuda.to_host(out)
        assert not np.isnan(got).any(), f"window {window}"
        assert rel_err(got, ref) < TOL, f"window {window}"


# 1: one block walks every chunk; 2, 3, 5: one cluster of 2, 4, 8 (sm_90+), not a multiple of it;
# 8: one full cluster; 13, 16: two clusters, blocks that loop past 16 chunks; 128: many clusters, most idle.
@pytest.mark.parametrize("n_blocks", [1, 2, 3, 5, 8, 13, 16, 128])
@pytest.mark.parametrize("heads", DECODE_HEADS, ids=["qwen", "gemma", "d64"])
def test_attention_decode_block_counts(cuda, cpu, rng, heads, n_blocks: int) -> None:
    """attention_decode.cu at any number of blocks per KV head: on sm_90+ through clusters that merge
    in shared memory (and, past one cluster's chunks, across clusters in global memory)."""
    check_decode(cuda, cpu, rng, heads, n_blocks)


@pytest.mark.parametrize("n_blocks", [1, 5, 16])
@pytest.mark.parametrize("heads", [(24, 4, 256), (16, 2, 256)], ids=["qwen35-27b", "qwen35-35b-a3b"])
def test_attention_decode_group8_of_256(cuda, cpu, rng, heads, n_blocks: int) -> None:
    """The (256, 8) build: Qwen3.5's groups of 6 and 8 query heads of 256 per KV head, against numpy."""
    check_decode(cuda, cpu, rng, heads, n_blocks)


@pytest.mark.parametrize("n_blocks", [5, 16])
def test_attention_decode_without_clusters(cuda, cpu, rng, n_blocks: int) -> None:
    """The global-memory merge alone (what sm_86/89 run, and sm_90+ with KernelOptions.decode_clusters off)."""
    check_decode(cuda, cpu, rng, (32, 8, 128), n_blocks, windows=(None, 300), clusters=False)


@pytest.mark.parametrize("n_blocks", [5, 16])
def test_attention_decode_programmatic_launch(cuda, cpu, rng, n_blocks: int) -> None:
    """Launched by cuLaunchKernelEx (pdl.py, as inside a decode graph's capture): the kernel's
    compile-time cluster dims hold there too, with no cluster attribute."""
    from app.engine.kernels.runtime import pdl

    with pdl.programmatic_launches():
        check_decode(cuda, cpu, rng, (32, 8, 128), n_blocks, windows=(None, 300))


def check_decode_qkv(
    cuda, cpu, rng, heads, n_blocks: int, windows=(None, 300), clusters: bool = True, rotary: int | None = None
) -> None:
    """attention_decode_qkv (rope_cache fused in) against rope_cache then attention_decode at `n_blocks`,
    each on its own copy of caches whose new tokens' entries start as NaN (the fused kernel must never
    read them): the same output, the same new k and v, nothing else written. Row 0 is a graph bucket's
    padding (context 0, slot -1: output 0), row 2 a padding token mid-context (slot -1: any finite
    output, nothing stored). Both rope layouts, with and without QK-norm, under every window; `rotary`
    below head_dim: partial RoPE."""
    import cupy

    from app.engine.kernels import attention_decode
    from app.engine.kernels.rope_cache import rope_cache

    n_heads, n_kv, head_dim = heads
    seqs = [(1, ctx) for ctx in decode_contexts(head_dim)]
    _, _, (kg, vg, mg) = make_batch(cuda, cpu, rng, seqs, n_heads, n_kv, head_dim)
    mg.seq_lens[0] = 0
    seq_lens, tables = cuda.to_host(mg.seq_lens), cuda.to_host(mg.block_tables)
    pos = np.maximum(seq_lens - 1, 0).astype(np.int32)
    slots = (tables[np.arange(len(seqs)), pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE).astype(np.int32)
    slots[[0, 2]] = -1
    new = slots[slots >= 0]
    compared = np.arange(len(seqs)) != 2
    kg.reshape(-1, n_kv, head_dim)[cuda.from_host(new)] = cupy.nan
    vg.reshape(-1, n_kv, head_dim)[cuda.from_host(new)] = cupy.nan
    cos, sin = (cuda.from_host(t) for t in rope_tables(rotary or head_dim, 4096))
    qkv = cuda.from_host(rng.standard_normal((len(seqs), (n_heads + 2 * n_kv) * head_dim)).astype(np.float32))
    norms = [cuda.from_host(rng.standard_normal(head_dim).astype(np.float32)) for _ in range(2)]
    pos_g, slots_g, scale = cuda.from_host(pos), cuda.from_host(slots), head_dim**-0.5
    assert attention_decode.rope_supported(head_dim, n_heads, n_kv, cos.shape[1] * 2)
    for window in windows:
        for interleaved, (qn, kn) in ((False, norms), (True, (None, None))):
            rope = (qkv, n_heads, n_kv, head_dim, qn, kn, 1e-6, pos_g, cos, sin, interleaved)
            k_two, v_two, k_one, v_one = kg.copy(), vg.copy(), kg.copy(), vg.copy()
            q = cupy.empty((len(seqs), n_heads, head_dim), cupy.float32)
            rope_cache(*rope, k_two, v_two, slots_g, q)
            out = cupy.full(q.shape, cupy.nan, cupy.float32)
            attention_decode.attention_decode_qkv(*rope, k_one, v_one, slots_g, mg.seq_lens, mg.block_tables, scale,
                                                  window, None, n_blocks, out, clusters)  # fmt: skip
            # The reference attends over the caches the fused kernel wrote: its new key may sit one
            # float16 step from rope_cache's (checked below), which alone moves the output by ~1e-5.
            ref = cupy.full(q.shape, cupy.nan, cupy.float32)
            attention_decode.attention_decode(q, k_one, v_one, mg.seq_lens, mg.block_tables, scale, window, None,
                                              n_blocks, ref, clusters)  # fmt: skip
            case = f"window {window}, interleaved {interleaved}"
            got, want = cuda.to_host(out), cuda.to_host(ref)
            assert np.isfinite(got).all(), case
            assert rel_err(got[compared], want[compared]) < 1e-5, case
            assert not got[0].any(), case
            # The same float16 values, up to one rounding step where the two builds' float32 norm differs.
            np.testing.assert_allclose(cuda.to_host(k_one).astype(np.float32), cuda.to_host(k_two).astype(np.float32),
                                       rtol=1e-3, atol=1e-3, err_msg=case)  # fmt: skip
            np.testing.assert_array_equal(cuda.to_host(v_one), cuda.to_host(v_two), err_msg=case)


@pytest.mark.parametrize(("heads", "rotary"), [((8, 2, 256), 64), ((32, 8, 128), 32), ((24, 4, 256), 64),
                                              ((16, 2, 256), 64)])  # fmt: skip
def test_attention_decode_qkv_partial_rope(cuda, cpu, rng, heads, rotary: int) -> None:
    """Qwen3.5 / Qwen3-Next's partial RoPE (a quarter of the head turns) fused into the decode attention
    gives rope_cache's q, k and v; Qwen3.5-27B's and 35B-A3B's groups (6 and 8 of 256) on the (256, 8) build."""
    check_decode_qkv(cuda, cpu, rng, heads, 3, windows=(None,), rotary=rotary)


@pytest.mark.parametrize("n_blocks", [1, 3, 8, 13, 128])
@pytest.mark.parametrize("heads", [*DECODE_HEADS, (32, 4, 128)], ids=["qwen", "gemma", "d64", "g8"])
def test_attention_decode_qkv_block_counts(cuda, cpu, rng, heads, n_blocks: int) -> None:
    """The rope_cache-fused decode attention at any number of blocks (clusters on sm_90+)."""
    check_decode_qkv(cuda, cpu, rng, heads, n_blocks)


@pytest.mark.parametrize("n_blocks", [5, 16])
def test_attention_decode_qkv_without_clusters(cuda, cpu, rng, n_blocks: int) -> None:
    """The fused build through the global-memory merge (sm_86/89, KernelOptions.decode_clusters off)."""
    check_decode_qkv(cuda, cpu, rng, (32, 8, 128), n_blocks, clusters=False)


@pytest.mark.parametrize("n_blocks", [5, 16])
def test_attention_decode_qkv_programmatic_launch(cuda, cpu, rng, n_blocks: int) -> None:
    """The fused build launched by cuLaunchKernelEx, as in a decode graph: its loads before the PDL
    wait (first chunk, positions, tables, weights) and its cache stores after it."""
    from app.engine.kernels.runtime import pdl

    with pdl.programmatic_launches():
        check_decode_qkv(cuda, cpu, rng, (32, 8, 128), n_blocks)


def test_attention_decode_clusters_on_sm90(cuda) -> None:
    """The device decides (one place): clusters from compute capability 9.0 on."""
    from app.engine.kernels import attention_decode
    from app.engine.kernels.runtime.compile import MIN_CLUSTER_CC, device_arch

    uses = attention_decode.block_layout(66, attention_decode.clusters_supported())[1] > 1
    assert uses == (int(device_arch()) >= MIN_CLUSTER_CC)


@pytest.mark.parametrize(
    "ctxs", [[300], [1], [40, 300, 700]]
)  # one sequence: the fused launch; three: two launches
@pytest.mark.parametrize("qk_norm", [True, False])
def test_rope_cache_attention_matches_numpy_composition(cuda, cpu, rng, ctxs, qk_norm: bool) -> None:
    """The backend op a decode layer calls (rope_cache_attention) against the numpy backend's
    rope_and_cache then attention, at Qwen3-8B's heads: the output and the new tokens' cache rows."""
    from app.engine.backend.base import QkvRope, RopeTable

    n_heads, n_kv, head_dim = 32, 8, 128
    seqs = [(1, ctx) for ctx in ctxs]
    _, (kc, vc, mc), (kg, vg, mg) = make_batch(cuda, cpu, rng, seqs, n_heads, n_kv, head_dim)
    tables = cuda.to_host(mg.block_tables)
    pos = np.array(ctxs, np.int32) - 1
    slots = (tables[np.arange(len(ctxs)), pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE).astype(np.int32)
    mc.slot_mapping, mg.slot_mapping = slots, cuda.from_host(slots)
    cos, sin = rope_tables(head_dim, 4096)
    norms = (
        [rng.uniform(0.5, 1.5, head_dim).astype(np.float32) for _ in range(2)] if qk_norm else [None, None]
    )
    qkv = rng.standard_normal((len(ctxs), (n_heads + 2 * n_kv) * head_dim)).astype(np.float32)
    rope_c = QkvRope(n_heads, n_kv, head_dim, *norms, 1e-6, RopeTable(cos, sin), False)
    gpu_norms = [None if w is None else cuda.from_host(w) for w in norms]
    rope_g = QkvRope(n_heads, n_kv, head_dim, *gpu_norms, 1e-6, cuda.rope_table(cos, sin), False)
    fused = len(ctxs) == 1 and cuda.fuses_rope(1, n_heads, head_dim)
    assert fused == (len(ctxs) == 1 and cuda.kernel_options.decode_rope != "off")
    scale = head_dim**-0.5
    got = cuda.to_host(cuda.rope_cache_attention(cuda.from_host(qkv), rope_g, kg, vg, mg, scale))
    want = cpu.rope_cache_attention(qkv, rope_c, kc, vc, mc, scale)
    assert rel_err(got, want) < 1e-3
    for got_cache, want_cache in ((kg, kc), (vg, vc)):
        rows = cuda.to_host(got_cache).reshape(-1, n_kv, head_dim)[slots].astype(np.float32)
        np.testing.assert_allclose(rows, want_cache.reshape(-1, n_kv, head_dim)[slots], rtol=2e-3, atol=2e-3)


# (sequences, decode_rope): 3 take the o product on gemv_mma (float16 x on gemv_mma2, the default), 24 cuBLAS on
# o's float16 copy;
# "off": rope_cache then attention_decode, "all": the fused launch (attention_decode_qkv)
@pytest.mark.parametrize("decode_rope", ["off", "all"])
@pytest.mark.parametrize("n_seqs", [3, 24])
def test_decode_attention_output_in_float16_for_an_output_product_on_its_copy(
    cuda, rng, n_seqs: int, decode_rope
) -> None:  # `cuda`: skipped without a GPU
    """Given the output projection (`then`) that reads float16 at this batch, rope_cache_attention writes its
    output in float16: the float32 output rounded once, as linear's cast would round it, so the product
    gives what it gives from the float32 output. Where o reads float32, the output stays float32."""
    import cupy
    from cuda_samples import random_tensor

    from app.engine.backend.base import QkvRope
    from app.engine.backend.cpu import CpuBackend
    from app.engine.backend.cuda.backend import CudaBackend
    from app.engine.backend.cuda.linear import takes_half
    from app.engine.kernels.options import KernelOptions

    dense = CudaBackend(dense_cache="on", kernel_options=KernelOptions(decode_rope=decode_rope))
    n_heads, n_kv, head_dim = 32, 8, 128
    ctxs = [int(c) for c in rng.integers(1, 400, n_seqs)]
    _, _, (kg, vg, mg) = make_batch(dense, CpuBackend(), rng, [(1, c) for c in ctxs], n_heads, n_kv, head_dim)
    tables = dense.to_host(mg.block_tables)
    pos = np.array(ctxs, np.int32) - 1
    mg.slot_mapping = dense.from_host(
        (tables[np.arange(n_seqs), pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE).astype(np.int32)
    )
    o = dense.load_weight(random_tensor("Q4_K", n_heads * head_dim, n_heads * head_dim, rng, name="blk.0.attn_output"))
    rope = QkvRope(n_heads, n_kv, head_dim, None, None, 1e-6, dense.rope_table(*rope_tables(head_dim, 4096)), False)
    qkv = dense.from_host(rng.standard_normal((n_seqs, (n_heads + 2 * n_kv) * head_dim)).astype(np.float32))
    scale = head_dim**-0.5
    assert dense.fuses_rope(n_seqs, n_heads, head_dim) == (decode_rope == "all")
    out16 = dense.rope_cache_attention(qkv, rope, kg, vg, mg, scale, then=o)
    out32 = dense.rope_cache_attention(qkv, rope, kg, vg, mg, scale)  # the same keys again: the same output
    half = takes_half(n_seqs, o, dense.gemv_plan)
    assert half == (n_seqs == 24 or dense.gemv_plan.mma_kernel == "v2")
    assert out16.dtype == (cupy.float16 if half else cupy.float32) and out32.dtype == cupy.float32
    np.testing.assert_array_equal(dense.to_host(out16), dense.to_host(out32).astype(out16.dtype))
    x16, x32 = (a.reshape(n_seqs, n_heads * head_dim) for a in (out16, out32))
    assert rel_err(dense.to_host(dense.linear(x16, o)), dense.to_host(dense.linear(x32, o))) < 1e-6
