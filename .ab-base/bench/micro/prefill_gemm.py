"""Prefill matrix products at one sequence's prompt sizes: cuBLAS as the engine calls it against
split-K variants, on the GPU machine.

The engine multiplies float16 x [T, k] by a weight's float16 copy [m, k] with float32 output
(cuda_blas.matmul_t). At T = 64-256 a tile grid over m x T leaves most multiprocessors idle for
the narrow products (o: m = k = 4096 gives 64 tiles of 128 x 128 on 132 SMs), so the product reads
its weight far below copy bandwidth. Split-K through cublasGemmStridedBatchedEx (batch i takes
columns i*k/s of both operands, writing its own float32 partial) and a sum of the partials gives
cuBLAS s times the tiles with the plain API.

    python3 bench/micro/prefill_gemm.py                # Qwen3-8B's products at T = 64, 160, 256
    python3 bench/micro/prefill_gemm.py --tokens 160   # one size

Prints one JSON line per (product, T): microseconds per variant, the weight's read rate and the
largest difference from the unsplit product.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "suite"))

from gpu_check import time_events

from app.engine.backend.cuda.blas import COMPUTE_32F, GEMM_DEFAULT, OP_N, OP_T, R_16F, R_32F, _lib, cublas

# Qwen3-8B: (name, m, k) of each product a layer runs in prefill
PRODUCTS = (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 24576, 4096), ("down", 4096, 12288))


def strided_batched(handle, m: int, n: int, k: int, w, x, partials, splits: int) -> None:
    """partials[i] = x[:, i*k/s:(i+1)*k/s] @ w[:, same].T, column-major as matmul_t lays it out."""
    lib = _lib()
    fn = lib.cublasGemmStridedBatchedEx
    p, i, ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
    fn.argtypes = [p, i, i, i, i, i, p, p, i, i, ll, p, i, i, ll, p, p, i, i, ll, i, i, i]
    fn.restype = ctypes.c_int
    ks = k // splits
    status = fn(
        handle._handle, OP_T, OP_N, m, n, ks, ctypes.byref(handle._one), p(w.data.ptr), R_16F, k, ks,
        p(x.data.ptr), R_16F, k, ks, ctypes.byref(handle._zero), p(partials.data.ptr), R_32F, m, m * n,
        splits, COMPUTE_32F, GEMM_DEFAULT,
    )  # fmt: skip
    assert status == 0, status


def measure(handle, name: str, m: int, k: int, n: int, w) -> dict:
    """One product at n tokens: the plain call and each split-K variant."""
    import cupy

    x = cupy.random.default_rng(n).standard_normal((n, k), dtype=cupy.float32).astype(cupy.float16)
    out = cupy.empty((n, m), cupy.float32)

    def plain() -> None:
        handle.gemm(OP_T, OP_N, m, n, k, w.data.ptr, R_16F, k, x.data.ptr, R_16F, k, out.data.ptr, R_32F, m)

    plain()
    reference = out.copy()
    result = {
        "product": name,
        "m": m,
        "k": k,
        "tokens": n,
        "plain_us": round(1e6 * time_events(plain, iters=50), 2),
    }
    for splits in (2, 3, 4, 6, 8):
        if k % splits or (k // splits) % 8:
            continue
        partials = cupy.empty((splits, n, m), cupy.float32)

        def split(splits: int = splits, partials=partials) -> None:
            strided_batched(handle, m, n, k, w, x, partials, splits)
            partials.sum(axis=0, out=out)

        split()
        result[f"split{splits}_max_diff"] = float(cupy.abs(out - reference).max())
        result[f"split{splits}_us"] = round(1e6 * time_events(split, iters=50), 2)
    best = min(v for key, v in result.items() if key.endswith("_us"))
    result["plain_weight_tb_s"] = round(w.nbytes / (result["plain_us"] * 1e-6) / 1e12, 2)
    result["best_weight_tb_s"] = round(w.nbytes / (best * 1e-6) / 1e12, 2)
    return result


def main() -> None:
    import cupy

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, nargs="*", default=[64, 160, 256])
    args = parser.parse_args()
    handle = cublas()
    handle._use_stream(cupy.cuda.get_current_stream().ptr)
    rng = cupy.random.default_rng(0)
    for name, m, k in PRODUCTS:
        w = (rng.standard_normal((m, k), dtype=cupy.float32) * 0.02).astype(cupy.float16)
        for n in args.tokens:
            print(json.dumps(measure(handle, name, m, k, n, w)), flush=True)


if __name__ == "__main__":
    main()
