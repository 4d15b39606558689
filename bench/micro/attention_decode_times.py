"""Decode attention alone (attention_decode.cu), one sequence at the Qwen3-8B head shape, timed
as CUDA-graph replays of back-to-back launches (H200): where its time goes at short contexts.

    python3 bench/micro/attention_decode_times.py          # short contexts, one sequence
    python3 bench/micro/attention_decode_times.py --long   # the agent rows: 8 x 8k and 1 x 32k
    python3 bench/micro/attention_decode_times.py --batch  # 16-128 sequences at short contexts (serving), 32 at 4k
    python3 bench/micro/attention_decode_times.py --batch --plan-only  # the same rows, the serving plan only
    python3 bench/micro/attention_decode_times.py --batch --shape qwen35-27b  # Qwen3.5-27B's heads (24 / 4 / 256)
    python3 bench/micro/attention_decode_times.py --ncu 128 256  # a few plain launches at the plan (for Nsight)
    python3 bench/micro/attention_decode_times.py --cascade  # 8 sessions over one 8,000-token prefix: its parts
    python3 bench/micro/attention_decode_times.py --cascade --seqs 16  # the same with 16 sessions

One line per (context, blocks per KV head): microseconds per launch. One block over several
chunks against one chunk per block shows the per-chunk cost; one chunk alone the floor; the
difference between one active block and several the cost of merging their partials.

`--long` times the contexts of issue 16's decode rows (8 sequences at 8k, 1 at 32k, 4 at 16k), each
launch on another layer's cache of LAYERS so that the 50 MB L2 holds none of it, and gives the KV
bytes read per second beside the microseconds: the number to hold against the copy bandwidth.

`--cascade` times kernels/attention_cascade.py's decode of 8 sequences whose first 8,000 keys are the same
blocks (agent sessions over one system prompt), each with 200 own keys: plain decode attention over the
whole contexts, the cascade at several splits of the shared keys, and the cascade's three launches alone
(the own keys through attention_decode.cu, the shared keys through attention_prefill.cu's split partials,
the merge), with the shared keys' bytes read per second. The cascade and its shared part run on both of
attention_prefill.cu's builds: `_kw` is the one whose warps split each tile's keys (KEY_WARPS).
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "suite"))

from gpu_check import _attention_setup, time_graph

from app.engine.backend.cuda.backend import CudaBackend
from app.engine.kernels.attention_decode import attention_decode

HEADS = {"qwen3-8b": (32, 8, 128), "qwen3-0.6b": (16, 8, 128)}
BATCH_SHAPES = {"qwen3-8b": (32, 8, 128), "qwen35-27b": (24, 4, 256)}  # --batch --shape NAME (27B: group 6 of 8)
LONG = ((8, 8000), (1, 32000), (4, 16000))  # (sequences, context)
LAYERS = 6  # distinct caches a timed graph cycles through: more bytes than L2


def long_contexts(backend: CudaBackend, blocks: tuple[int, ...]) -> None:
    import cupy

    from app.engine.kernels.attention_decode import block_layout, clusters_supported, plan_blocks

    _, n_kv, head_dim = HEADS["qwen3-8b"]
    sm_count = cupy.cuda.Device().attributes["MultiProcessorCount"]
    rng = np.random.default_rng(0)
    for n_seqs, ctx in LONG:
        layers = [_attention_setup(backend, rng, n_seqs, ctx, 1, HEADS["qwen3-8b"]) for _ in range(LAYERS)]
        kv_bytes = 2 * n_seqs * ctx * n_kv * head_dim * 2
        row: dict = {"shape": "qwen3-8b", "seqs": n_seqs, "ctx": ctx, "kv_mb": round(kv_bytes / 1e6, 1)}
        for bps in blocks:
            n_blocks = plan_blocks(n_seqs, n_kv, ctx, sm_count, head_dim, bps)
            calls = []
            for q, kc, vc, meta in layers:
                out = cupy.empty_like(q)
                args = (q, kc, vc, meta.seq_lens, meta.block_tables, head_dim**-0.5, None, None, n_blocks, out)
                calls.append(functools.partial(attention_decode, *args))
            seconds, _ = time_graph(calls * 4)
            grid = block_layout(n_blocks, clusters_supported())[0]
            row[f"bps{bps}"] = {"us": round(seconds * 1e6, 1), "tb_s": round(kv_bytes / seconds / 1e12, 2), "blocks": grid}
        print(json.dumps(row), flush=True)
        del layers
        cupy.get_default_memory_pool().free_all_blocks()


BATCH = ((16, 256), (32, 256), (64, 256), (128, 256), (128, 1024), (32, 4096))  # (sequences, context): serving at c=16-128
BATCH_PLAN_CONTEXT = 4096  # the context a decode graph's plan is made for (its max_model_len in the serve runs)


def batch_contexts(backend: CudaBackend, plan_only: bool = False, shape: str = "qwen3-8b") -> None:
    """Many sequences at short contexts, as in ISL/OSL 128 serving at c=16-128, and 32 at 4k (whether the one-wave
    plan costs a long context): each launch on another layer's cache (more bytes than L2), the plan's block count
    against others, clusters on and off."""
    import cupy

    from app.engine.kernels.attention_decode import block_layout, clusters_supported, plan_blocks

    heads = BATCH_SHAPES[shape]
    _, n_kv, head_dim = heads
    sm_count = cupy.cuda.Device().attributes["MultiProcessorCount"]
    bps = backend.tuning.decode_blocks_per_sm
    rng = np.random.default_rng(0)
    for n_seqs, ctx in BATCH:
        layers = [_attention_setup(backend, rng, n_seqs, ctx, 1, heads) for _ in range(LAYERS)]
        kv_bytes = 2 * n_seqs * ctx * n_kv * head_dim * 2
        planned = plan_blocks(n_seqs, n_kv, BATCH_PLAN_CONTEXT, sm_count, head_dim, bps)
        row: dict = {"shape": shape, "seqs": n_seqs, "ctx": ctx, "kv_mb": round(kv_bytes / 1e6, 1),
                     "plan_blocks": planned}  # fmt: skip
        for n_blocks in [planned] if plan_only else sorted({1, 2, 4, 8, planned}):
            for clusters in (True, False) if clusters_supported() and not plan_only else (clusters_supported(),):
                calls = []
                for q, kc, vc, meta in layers:
                    out = cupy.empty_like(q)
                    args = (q, kc, vc, meta.seq_lens, meta.block_tables, head_dim**-0.5, None, None, n_blocks, out)
                    calls.append(functools.partial(attention_decode, *args, clusters=clusters))
                seconds, _ = time_graph(calls * 4)
                key = f"blocks{block_layout(n_blocks, clusters)[0]}{'_cl' if clusters else ''}"
                row[key] = {"us": round(seconds * 1e6, 1), "tb_s": round(kv_bytes / seconds / 1e12, 2)}
        print(json.dumps(row), flush=True)
        del layers
        cupy.get_default_memory_pool().free_all_blocks()


def launches_for_a_profiler(backend: CudaBackend, n_seqs: int, ctx: int) -> None:
    """A few plain launches (no graph) of the serving plan at `n_seqs` x `ctx`, for Nsight Compute to take one."""
    import cupy

    from app.engine.kernels.attention_decode import plan_blocks

    _, n_kv, head_dim = HEADS["qwen3-8b"]
    sm_count = cupy.cuda.Device().attributes["MultiProcessorCount"]
    n_blocks = plan_blocks(n_seqs, n_kv, BATCH_PLAN_CONTEXT, sm_count, head_dim, backend.tuning.decode_blocks_per_sm)
    q, kc, vc, meta = _attention_setup(backend, np.random.default_rng(0), n_seqs, ctx, 1, HEADS["qwen3-8b"])
    out = cupy.empty_like(q)
    for _ in range(3):
        attention_decode(q, kc, vc, meta.seq_lens, meta.block_tables, head_dim**-0.5, None, None, n_blocks, out)
    cupy.cuda.Device().synchronize()
    print(json.dumps({"seqs": n_seqs, "ctx": ctx, "plan_blocks": n_blocks}), flush=True)


CASCADE = (8, 8000, 200)  # sequences, shared keys, own keys
CASCADE_SPLITS = (8, 16, 32)


def cascade_parts(backend: CudaBackend) -> None:
    import cupy

    from app.engine.backend.base import SharedPrefix
    from app.engine.kernels import attention_prefill
    from app.engine.kernels.attention_cascade import cascade_decode, plan_splits
    from app.engine.kernels.attention_decode import plan_blocks

    n_seqs, shared, own = CASCADE
    if "--seqs" in sys.argv:
        n_seqs = int(sys.argv[sys.argv.index("--seqs") + 1])
    n_heads, n_kv, head_dim = HEADS["qwen3-8b"]
    ctx, block_size = shared + own, 16
    sm_count = cupy.cuda.Device().attributes["MultiProcessorCount"]
    rng = np.random.default_rng(0)
    layers = []
    for _ in range(LAYERS):  # each launch on another layer's cache: more bytes than L2
        q, kc, vc, meta = _attention_setup(backend, rng, n_seqs, ctx, 1, HEADS["qwen3-8b"], block_size)
        tables = meta.block_tables
        tables[:, : shared // block_size] = tables[0, : shared // block_size]  # the shared blocks lead every table
        layers.append((q, kc, vc, meta))
    prefix = SharedPrefix(query_start_loc=cupy.asarray([0, n_seqs], cupy.int32),
                          seq_len=cupy.asarray([shared - 1 + n_seqs], cupy.int32),
                          length=cupy.asarray([shared], cupy.int32))  # fmt: skip
    n_blocks = plan_blocks(n_seqs, n_kv, ctx, sm_count, head_dim, backend.tuning.decode_blocks_per_sm)
    scale, shared_bytes = head_dim**-0.5, 2 * shared * n_kv * head_dim * 2
    row: dict = {"shape": "qwen3-8b", "seqs": n_seqs, "shared": shared, "own": own, "own_plan_blocks": n_blocks,
                 "plan_splits": plan_splits(n_kv, sm_count), "shared_mb": round(shared_bytes / 1e6, 1)}  # fmt: skip

    def timed(make) -> float:
        seconds, _ = time_graph([make(*layer) for layer in layers] * 4)
        return round(seconds * 1e6, 1)

    row["plain_us"] = timed(lambda q, kc, vc, m: functools.partial(
        attention_decode, q, kc, vc, m.seq_lens, m.block_tables, scale, None, None, n_blocks, cupy.empty_like(q)))
    for splits in CASCADE_SPLITS:
        for suffix, rows in (("", 0), ("_kw", n_seqs * n_heads // n_kv)):  # the shared part on either build
            row[f"cascade{splits}{suffix}_us"] = timed(lambda q, kc, vc, m, s=splits, r=rows: functools.partial(
                cascade_decode, q, kc, vc, m.seq_lens, m.block_tables, prefix, scale, None, n_blocks, s,
                cupy.empty_like(q), key_warp_rows=r))
    lse = cupy.empty((n_seqs, n_heads), cupy.float32)
    row["own_us"] = timed(lambda q, kc, vc, m: functools.partial(
        attention_decode, q, kc, vc, m.seq_lens, m.block_tables, scale, None, None, n_blocks, cupy.empty_like(q),
        key_floor=prefix.length, lse_out=lse))
    for blocks in (1, 2, 4):  # the own keys' blocks a pair (PADDOCK_CASCADE_OWN_BLOCKS) against the plain plan's
        row[f"own_b{blocks}_us"] = timed(lambda q, kc, vc, m, b=blocks: functools.partial(
            attention_decode, q, kc, vc, m.seq_lens, m.block_tables, scale, None, None, b, cupy.empty_like(q),
            key_floor=prefix.length, lse_out=lse))
    for splits in CASCADE_SPLITS:
        for suffix, kw in (("", False), ("_kw", True)):  # the default build, the key-split one (KEY_WARPS)
            us = timed(lambda q, kc, vc, m, s=splits, k=kw: functools.partial(
                attention_prefill.split_partials, q, kc, vc, prefix.query_start_loc, prefix.seq_len,
                m.block_tables[:1], scale, None, None, s, key_limit=prefix.length, key_warps=k))
            row[f"shared{splits}{suffix}"] = {"us": us, "tb_s": round(shared_bytes / (us * 1e-6) / 1e12, 2)}
        q = layers[0][0]
        part_o, part_ml = attention_prefill.split_partials(q, *layers[0][1:3], prefix.query_start_loc, prefix.seq_len,
                                                           layers[0][3].block_tables[:1], scale, None, None, splits,
                                                           key_limit=prefix.length)  # fmt: skip
        own_o, out = cupy.empty_like(q), cupy.empty_like(q)
        seconds, _ = time_graph([functools.partial(attention_prefill.merge_splits, part_o, part_ml, out, own_o, lse)]
                                * 24)  # fmt: skip
        row[f"merge{splits}_us"] = round(seconds * 1e6, 1)
    print(json.dumps(row), flush=True)


def main() -> None:
    import cupy

    backend = CudaBackend()
    if "--cascade" in sys.argv:
        cascade_parts(backend)
        return
    if "--ncu" in sys.argv:
        at = sys.argv.index("--ncu")
        launches_for_a_profiler(backend, int(sys.argv[at + 1]), int(sys.argv[at + 2]))
        return
    if "--long" in sys.argv:
        long_contexts(backend, (2, 3, 4, 6, 8, 12))
        return
    if "--batch" in sys.argv:
        shape = sys.argv[sys.argv.index("--shape") + 1] if "--shape" in sys.argv else "qwen3-8b"
        batch_contexts(backend, plan_only="--plan-only" in sys.argv, shape=shape)
        return
    rng = np.random.default_rng(0)
    for name, heads in HEADS.items():
        for ctx in (64, 330, 1000, 4000):
            q, kc, vc, meta = _attention_setup(backend, rng, 1, ctx, 1, heads)
            out = cupy.empty_like(q)
            row: dict = {"shape": name, "ctx": ctx}
            for n_blocks in (1, 2, 4, 8, 16, 64):
                args = (q, kc, vc, meta.seq_lens, meta.block_tables, heads[2] ** -0.5, None, None, n_blocks, out)  # fmt: skip
                seconds, _ = time_graph([functools.partial(attention_decode, *args)] * 40)
                row[f"blocks_{n_blocks}"] = round(seconds * 1e6, 2)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
