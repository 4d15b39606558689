"""Prefill attention alone (attention_prefill.cu) at the agent rows' shapes, on the GPU machine: a 2,048-token
chunk whose sequence already holds CTX - 2,048 tokens (the last chunk of an 8,000- or 32,000-token prompt), the
Qwen3-8B's heads (32 over 8 KV heads of 128), one layer.

    python3 bench/micro/prefill_attention_times.py                  # ctx 2048, 8192, 32768: ms and TFLOP/s
    PADDOCK_KERNEL_DEFINES=PF_LAZY=8 python3 bench/micro/prefill_attention_times.py   # an A/B build
    ncu --section SpeedOfLight --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis \\
        -k regex:attn_prefill -c 1 python3 bench/micro/prefill_attention_times.py --once --ctx 8192

One JSON line per context: milliseconds a call (CUDA events around a replayed graph of CALLS calls, median of 5),
the causal FLOPs it does (4 x queries x visible keys x head dim x heads) and their rate. `--once`: a single call
per context after one warm-up call (for a profiler), no timing.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "suite"))

CHUNK = 2048
HEADS = (32, 8, 128)
CALLS = 10


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ctx", nargs="*", type=int, default=[2048, 8192, 32768])
    ap.add_argument("--once", action="store_true")
    args = ap.parse_args(argv)
    import cupy
    from gpu_check import _attention_setup, time_graph

    from app.engine import envs
    from app.engine.backend.cuda.backend import CudaBackend
    from app.engine.kernels.attention_prefill import attention_prefill, plan_splits

    backend = CudaBackend()
    rng = np.random.default_rng(0)
    n_heads, n_kv, head_dim = HEADS
    for ctx in args.ctx:
        q, k_cache, v_cache, meta = _attention_setup(backend, rng, 1, ctx, CHUNK, HEADS)
        out = cupy.empty_like(q)
        splits = plan_splits(CHUNK, 1, n_heads, n_kv, ctx, backend.sm_count, head_dim)
        call = partial(attention_prefill, q, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables,
                       head_dim**-0.5, None, None, splits, out)  # fmt: skip

        call()
        if args.once:
            cupy.cuda.Device().synchronize()
            continue
        seconds, how = time_graph([call] * CALLS, reps=5)
        keys = sum(ctx - CHUNK + i + 1 for i in range(CHUNK))  # causal: query i sees the context and i + 1 chunk keys
        flops = 4 * keys * head_dim * n_heads
        print(json.dumps({"ctx": ctx, "chunk": CHUNK, "heads": list(HEADS), "splits": splits, "ms": round(seconds * 1e3, 3),
                          "tflop_s": round(flops / seconds / 1e12, 1), "timing": how,
                          "defines": dict(envs.PADDOCK_KERNEL_DEFINES)}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
