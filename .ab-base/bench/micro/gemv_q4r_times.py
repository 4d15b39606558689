"""Products of 1..128 tokens on K-quant weights, on the GPU machine: gemv_q4r.cu on the repacked weight
against cuBLAS on a float16 copy (what the 8B's decode step uses from 17 tokens), gemv_mma2.cu on the
GGUF blocks (up to 64 tokens: its range; from 3 to 16 tokens today's path), and the one-token GEMV
(gemv_int, at 1 token).

Products: the Qwen3-8B's matrices as Q4_K_M stores them (q 4096 x 4096 with k/v 1024 x 4096 stacked, v in Q4_K
or Q6_K; gate+up 2 x 12288 x 4096; o 4096 x 4096; down 4096 x 12288 in Q4_K or Q6_K; the 151,936-row output head
in Q6_K): Q4_K alone in the 4-bit layout, the rest in the byte one. Weight bytes are random (valid scales), in
enough copies that cycling through them misses L2, as a decode step does.

    python3 bench/micro/gemv_q4r_times.py                       # every product and token count (~1 min)
    python3 bench/micro/gemv_q4r_times.py --tokens 16 32 --products gate+up

One JSON line per (product, tokens): microseconds a call of each path (CUDA events around a replayed graph
of CALLS calls, median of 5), TB/s of the Q4_K bytes, gemv_q4r's shape (its splits by the build's resident
blocks on this GPU) and its time at the other column splits (q4r_splits<S>_us) and, up to 32 tokens, with
four 16-row tiles a warp (q4r_mt4_splits<S>_us), and each path's relative difference from cuBLAS on the
float16 copy. A last line gives the time q4r_pack took per GB of Q4_K.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "suite"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from app.engine.kernels import gemv_q4r as q4r

TOKENS = (1, 2, 4, 8, 16, 32, 64, 128)
Q4, Q6 = "Q4_K", "Q6_K"
PRODUCTS = {
    "qkv": ((Q4, 4096), (Q4, 1024), (Q4, 1024)), "qkv6": ((Q4, 4096), (Q4, 1024), (Q6, 1024)),
    "gate+up": ((Q4, 12288), (Q4, 12288)), "o": ((Q4, 4096),), "down": ((Q4, 4096),), "down6": ((Q6, 4096),),
    "head6": ((Q6, 151936),),
}  # fmt: skip
COLS = {"qkv": 4096, "qkv6": 4096, "gate+up": 4096, "o": 4096, "down": 12288, "down6": 12288, "head6": 4096}
CALLS = 50
ROTATE_BYTES = 192 << 20
MAX_COPIES = 24


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", nargs="*", type=int, default=list(TOKENS))
    ap.add_argument("--products", nargs="*", choices=list(PRODUCTS), default=[p for p in PRODUCTS if p != "head6"])
    args = ap.parse_args(argv)
    import cupy

    from app.engine.backend.cuda.backend import CudaBackend

    CudaBackend()
    rng = np.random.default_rng(0)
    pack_s = pack_bytes = 0.0
    for name in args.products:
        seconds, nbytes = measure(name, args.tokens, rng, cupy)
        pack_s, pack_bytes = pack_s + seconds, pack_bytes + nbytes
    print(json.dumps({"pack_ms_per_gb": round(pack_s * 1e3 / (pack_bytes / 1e9), 1)}), flush=True)


def measure(name: str, tokens: list[int], rng: np.random.Generator, cupy) -> tuple[float, int]:
    from gemv_mma_times import random_weight
    from gpu_check import time_graph

    from app.engine.backend.cuda.blas import matmul_t
    from app.engine.backend.cuda.expand import expand_rows
    from app.engine.kernels import gemv_int
    from app.engine.kernels.gemv_mma import gemv_mma

    parts, n_cols = PRODUCTS[name], COLS[name]
    weights = [random_weight(qtype, r, n_cols, rng) for qtype, r in parts]
    qtypes = [qtype for qtype, _ in parts]
    nbytes = sum(w.n_rows * w.row_bytes for w in weights)
    copies = max(1, min(MAX_COPIES, -(-ROTATE_BYTES // nbytes)))
    weight_sets = [weights] + [
        [replace(w, data=cupy.array(w.data)) for w in weights] for _ in range(copies - 1)
    ]
    cupy.cuda.Device().synchronize()
    started = time.perf_counter()
    packed = [q4r.pack([(w.data, q, w.row_bytes, w.n_rows) for w, q in zip(ws, qtypes, strict=True)], n_cols)
              for ws in weight_sets]  # fmt: skip
    cupy.cuda.Device().synchronize()
    pack_s = time.perf_counter() - started
    n_rows = packed[0].n_rows
    dense = cupy.empty((n_rows, n_cols), cupy.float16)
    row = 0
    for w in weights:
        expand_rows(w, dense[row : row + w.n_rows])
        row += w.n_rows
    dense_sets = [dense] + [
        dense.copy() for _ in range(max(1, min(MAX_COPIES, -(-ROTATE_BYTES // dense.nbytes))) - 1)
    ]
    mma_sets = [[(w.data, q, w.row_bytes, w.n_rows) for w, q in zip(ws, qtypes, strict=True)] for ws in weight_sets]
    for n_tok in tokens:
        x = cupy.asarray(rng.standard_normal((n_tok, n_cols)).astype(np.float32))
        x16 = x.astype(cupy.float16)
        outs = {m: cupy.empty((n_tok, n_rows), cupy.float32) for m in ("q4r", "cublas16", "v2", "gemv")}
        calls = {
            "q4r": [partial(q4r.gemv_q4r, p, x, outs["q4r"]) for p in packed],
            "cublas16": [partial(matmul_t, x16, d, outs["cublas16"]) for d in dense_sets],
        }
        if 2 <= n_tok <= 64 and len(parts) <= 3:
            calls["v2"] = [partial(gemv_mma, s, n_cols, x, outs["v2"], kernel="v2") for s in mma_sets]
        if n_tok == 1 and len(parts) == 1:
            calls["gemv"] = [partial(gemv_int.gemv_int, w[0].data, qtypes[0], w[0].row_bytes, n_rows, n_cols, x, outs["gemv"])
                             for w in weight_sets]  # fmt: skip
        shape = q4r.device_shape(n_tok, n_rows, n_cols, packed[0].layout)
        line = {"product": name, "layout": packed[0].layout, "rows": n_rows, "cols": n_cols, "tokens": n_tok, "mb": round(nbytes / 1e6, 1),
                "q4r_shape": f"mt{shape.m_tiles} nt{shape.n_tiles} splits{shape.splits}"}  # fmt: skip
        for method, fns in calls.items():
            seconds, how = time_graph([fns[i % len(fns)] for i in range(CALLS)], reps=5)
            line[f"{method}_us"] = round(seconds * 1e6, 2)
            line[f"{method}_tb_s"] = round(nbytes / seconds / 1e12, 3)
            if how != "graph":
                line[f"{method}_timing"] = how
        for splits in (1, 2, 4, 8, 16):
            if splits == shape.splits or n_cols // q4r.CHUNK < 4 * splits:
                continue
            other = replace(shape, splits=splits)
            fns = [partial(q4r.gemv_q4r, p, x, outs["q4r"], shape=other) for p in packed]
            seconds, _ = time_graph([fns[i % len(fns)] for i in range(CALLS)], reps=5)
            line[f"q4r_splits{splits}_us"] = round(seconds * 1e6, 2)
        if n_tok <= 32:  # four 16-row tiles a warp: each staged chunk of x serves twice the weight bytes
            for splits in sorted({shape.splits, min(q4r.MAX_SPLITS, 2 * shape.splits)}):
                if n_cols // q4r.CHUNK < 4 * splits:
                    continue
                other = q4r.Q4rShape(4, shape.n_tiles, splits)
                fns = [partial(q4r.gemv_q4r, p, x, outs["q4r"], shape=other) for p in packed]
                seconds, _ = time_graph([fns[i % len(fns)] for i in range(CALLS)], reps=5)
                line[f"q4r_mt4_splits{splits}_us"] = round(seconds * 1e6, 2)
        ref = outs["cublas16"]
        for method in calls:
            if method != "cublas16":
                diff = cupy.linalg.norm(outs[method] - ref) / cupy.linalg.norm(ref)
                line[f"{method}_rel_diff"] = float(f"{float(diff):.3g}")
        print(json.dumps(line), flush=True)
    return pack_s, nbytes * len(weight_sets)


if __name__ == "__main__":
    main()
