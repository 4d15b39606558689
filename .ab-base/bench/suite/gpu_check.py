#!/usr/bin/env python3
"""Everything the CUDA backend needs checked on a GPU machine, in one call.

    python3 bench/suite/gpu_check.py --out "$OUT"            # tests, then micro-benchmarks
    python3 bench/suite/gpu_check.py --out "$OUT" --no-tests # benchmarks only

Stages, each logged under --out and summarised in a table printed last:
  1. device facts (name, SMs, clocks from nvidia-smi, CuPy/NVRTC versions);
  2. the GPU test suite (`pytest -m gpu tests/engine/cuda`) and the kernel compile check
     through NVRTC for sm_86/89/90/120;
  3. copy bandwidth (device-to-device, bytes read + written): the ceiling for step 4;
  4. quantized GEMV at Qwen3-8B shapes in Q4_K, Q6_K and Q8_0: weight GB/s and fraction
     of the copy bandwidth, per warps-per-block variant, each checked against the oracle
     on sampled rows; timed as CUDA-graph replays over weight copies that exceed L2;
  5. prefill matrix products: dequantize-then-cuBLAS against cuBLAS alone on a float16
     weight (the cost of the dequantization);
  6. paged attention decode at contexts 512 / 4096 / 32768 (KV GB/s), and one prefill.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "engine" / "cuda"))

from cuda_samples import dequantize_oracle, oracle_name, random_tensor  # noqa: E402

RESULTS: dict[str, object] = {}
SUMMARY: list[str] = []


def log(msg: str) -> None:
    print(msg, flush=True)


RESULTS_PATH: list[Path] = []


def stage(name: str, fn: Callable[[], None]) -> None:
    """Run one stage; a failure is recorded and the next stage still runs. Results are
    written after every stage, so a run cut short by its time limit still leaves them."""
    t0 = time.time()
    log(f"\n=== {name} ===")
    try:
        fn()
        SUMMARY.append(f"{name}: ok ({time.time() - t0:.1f} s)")
    except Exception:
        tb = traceback.format_exc()
        log(tb)
        RESULTS.setdefault("errors", []).append({"stage": name, "traceback": tb})  # type: ignore[union-attr]
        SUMMARY.append(f"{name}: FAILED ({time.time() - t0:.1f} s) {tb.strip().splitlines()[-1]}")
    if RESULTS_PATH:
        RESULTS_PATH[0].write_text(json.dumps(RESULTS, indent=1, default=str))


# -- timing -----------------------------------------------------------------------------------


def time_events(fn: Callable[[], object], iters: int = 20, reps: int = 5) -> float:
    """Median seconds per call, device events around `iters` back-to-back calls."""
    import cupy

    fn()
    cupy.cuda.Device().synchronize()
    samples = []
    for _ in range(reps):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(iters):
            fn()
        stop.record()
        stop.synchronize()
        samples.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3 / iters)
    return statistics.median(samples)


def time_graph(fns: list[Callable[[], object]], reps: int = 7) -> tuple[float, str]:
    """Median seconds per call of `fns` captured in one CUDA graph (launch gaps ~1 µs).

    Falls back to plain event timing when capture fails."""
    import cupy

    cupy.cuda.Device().synchronize()  # the side stream does not wait for inputs written on the default one
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        for fn in fns[:2]:
            fn()
        stream.synchronize()
        try:
            stream.begin_capture()
            for fn in fns:
                fn()
            graph = stream.end_capture()
        except Exception as exc:  # capture unsupported for this call: time without a graph
            with contextlib.suppress(Exception):
                stream.end_capture()
            log(f"  graph capture failed ({exc!r}); timing without a graph")
            return time_events(lambda: [f() for f in fns], iters=1, reps=reps) / len(fns), "events"
        graph.launch(stream)
        stream.synchronize()
        samples = []
        for _ in range(reps):
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            graph.launch(stream)
            stop.record(stream)
            stop.synchronize()
            samples.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3 / len(fns))
    return statistics.median(samples), "graph"


# -- stages -------------------------------------------------------------------------------------


def device_facts() -> None:
    import cupy

    from app.engine.backend.cuda.backend import CudaBackend, cuda_available

    _, text = cuda_available()
    backend = CudaBackend()
    props = cupy.cuda.runtime.getDeviceProperties(0)
    facts = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "device": text,
        "sm_count": backend.sm_count,
        "l2_bytes": int(props.get("l2CacheSize", 0)),
        "cupy": cupy.__version__,
        "nvrtc": ".".join(map(str, cupy.cuda.nvrtc.getVersion())),
        "driver": cupy.cuda.runtime.driverGetVersion(),
        "python": platform.python_version(),
        "oracle": oracle_name(),
    }
    try:
        facts["nvidia_smi"] = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu",
                "--format=csv",
            ],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
    except Exception as exc:
        facts["nvidia_smi"] = repr(exc)
    RESULTS["device"] = facts
    for k, v in facts.items():
        log(f"  {k}: {v}")


def run_tests(out: Path) -> None:
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    cmds = {
        "gpu_suite": [sys.executable, "-m", "pytest", "-m", "gpu", "tests/engine/cuda", "-q", "-p", "no:cacheprovider",
                      "-o", "addopts=", "-o", "timeout=120", "--tb=short", "-rf"],
        "nvrtc_compile": [sys.executable, "-m", "pytest", "tests/engine/test_kernels_compile.py", "-q",
                          "-p", "no:cacheprovider", "-o", "addopts=", "-k", "kernel_compiles", "--tb=short"],
    }  # fmt: skip
    envs = {"gpu_suite": env, "nvrtc_compile": dict(env, PADDOCK_COMPILE_WITH="nvrtc")}
    RESULTS["tests"] = {}
    for name, cmd in cmds.items():
        t0 = time.time()
        done = subprocess.run(cmd, cwd=ROOT, env=envs[name], capture_output=True, text=True, timeout=300)
        (out / f"{name}.log").write_text(done.stdout + done.stderr)
        tail = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
        RESULTS["tests"][name] = {
            "rc": done.returncode,
            "summary": tail,
            "seconds": round(time.time() - t0, 1),
        }  # type: ignore[index]
        log(f"  {name}: rc={done.returncode} {tail} ({time.time() - t0:.0f} s)")
        if done.returncode:
            failed = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
            log("\n".join(failed[:40]))
        SUMMARY.append(f"  {name}: {tail}")


def copy_bandwidth() -> None:
    import cupy

    n = 4 << 30
    a = cupy.ones(n, cupy.uint8)
    b = cupy.empty_like(a)
    t = time_events(functools.partial(b.data.copy_from_device_async, a.data, n), iters=5, reps=5)
    gbs = 2 * n / t / 1e9
    RESULTS["copy_gbs"] = gbs
    log(f"  device-to-device copy of {n >> 30} GiB: {t * 1e3:.2f} ms, {gbs:.0f} GB/s (read + write)")
    SUMMARY.append(f"  copy bandwidth: {gbs:.0f} GB/s")


GEMV_SHAPES = [(4096, 4096), (12288, 4096), (4096, 12288), (151936, 4096)]  # (out, in) = weight [rows, cols]
GEMV_QTYPES = ["Q4_K", "Q6_K", "Q8_0"]


def _gpu_copies(data, want_bytes: int) -> list:
    import cupy

    count = max(1, min(24, -(-want_bytes // data.nbytes)))
    return [data] + [cupy.array(data) for _ in range(count - 1)]


def gemv_bench(quick: bool) -> None:
    import cupy

    from app.engine.backend.cuda.backend import CudaBackend
    from app.engine.kernels.gemv import VARIANTS, default_rows, default_warps, gemv

    backend = CudaBackend()
    copy_gbs = float(RESULTS.get("copy_gbs") or 4300.0)
    rng = np.random.default_rng(0)
    rows_out = []
    for qtype in GEMV_QTYPES:
        for n_rows, n_cols in GEMV_SHAPES:
            tensor = random_tensor(qtype, n_rows, n_cols, rng)
            weight = backend.load_weight(tensor)
            copies = _gpu_copies(weight.data, 256 << 20)
            for n_tok in (1, 8):
                x = cupy.asarray(rng.standard_normal((n_tok, n_cols)).astype(np.float32))
                out = cupy.empty((n_tok, n_rows), cupy.float32)
                # correctness on sampled rows, against the numpy oracle
                gemv(weight.data, qtype, weight.row_bytes, n_rows, n_cols, x, out)
                sample = rng.choice(n_rows, 64, replace=False)
                sub = type(tensor)(tensor.name, tensor.qtype, (64, n_cols), tensor.data[sample])
                ref = cupy.asnumpy(x).astype(np.float64) @ dequantize_oracle(sub).astype(np.float64).T
                got = cupy.asnumpy(out)[:, sample]
                err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
                variants = [(default_warps(n_cols), default_rows(8 if n_tok > 4 else n_tok, qtype))]
                if not quick and n_tok == 1:
                    variants = sorted({(w, r) for w in (2, 4, 8, default_warps(n_cols)) for r in VARIANTS[1]})
                for warps, rows_pb in variants:
                    fns = [
                        functools.partial(
                            gemv, d, qtype, weight.row_bytes, n_rows, n_cols, x, out, None, warps, rows_pb
                        )
                        for d in copies * max(1, 48 // len(copies))
                    ]
                    sec, how = time_graph(fns)
                    gbs = weight.row_bytes * n_rows / sec / 1e9
                    default = warps == default_warps(n_cols) and rows_pb == default_rows(
                        8 if n_tok > 4 else n_tok, qtype
                    )
                    row = {
                        "qtype": qtype, "rows": n_rows, "cols": n_cols, "tokens": n_tok, "warps": warps,
                        "rows_per_block": rows_pb, "us": round(sec * 1e6, 2), "weight_gbs": round(gbs, 1),
                        "frac_copy": round(gbs / copy_gbs, 3), "rel_err": err, "timing": how, "default": default,
                    }  # fmt: skip
                    rows_out.append(row)
                    log(f"  {qtype} [{n_rows}x{n_cols}] T={n_tok} warps={warps} R={rows_pb}: {sec * 1e6:8.2f} us "
                        f"{gbs:7.0f} GB/s ({gbs / copy_gbs:5.1%} of copy) err={err:.1e} [{how}]")  # fmt: skip
            del copies, weight
            cupy.get_default_memory_pool().free_all_blocks()
    RESULTS["gemv"] = rows_out
    for r in rows_out:
        if r["default"]:
            same = [o for o in rows_out if (o["qtype"], o["rows"], o["cols"], o["tokens"])
                    == (r["qtype"], r["rows"], r["cols"], r["tokens"])]  # fmt: skip
            best = min(same, key=lambda o: o["us"])
            SUMMARY.append(f"  gemv {r['qtype']} {r['rows']}x{r['cols']} T={r['tokens']}: {r['us']} us, "
                           f"{r['weight_gbs']} GB/s ({r['frac_copy']:.0%}); best {best['us']} us "
                           f"(warps {best['warps']}, R {best['rows_per_block']})")  # fmt: skip


def prefill_bench(quick: bool) -> None:
    import cupy

    from app.engine.backend.cuda.backend import CudaBackend
    from app.engine.backend.cuda.blas import matmul_t
    from app.engine.backend.cuda.linear import GEMV_MAX_TOKENS, matmul_quantized
    from app.engine.kernels.dequant import dequant_rows
    from app.engine.kernels.gemv import gemv

    backend = CudaBackend(dense_cache="off")  # the dequantizing path; "cuBLAS alone" is the cached one
    rng = np.random.default_rng(1)
    results = []
    for qtype, (n_rows, n_cols) in [("Q4_K", (12288, 4096)), ("Q4_K", (4096, 12288)), ("Q6_K", (4096, 4096))]:
        tensor = random_tensor(qtype, n_rows, n_cols, rng)
        weight = backend.load_weight(tensor)
        w16 = cupy.empty((n_rows, n_cols), cupy.float16)
        dequant_rows(weight.data, qtype, weight.row_bytes, n_rows, n_cols, w16)
        t_deq = time_events(
            functools.partial(dequant_rows, weight.data, qtype, weight.row_bytes, n_rows, n_cols, w16), 10
        )
        for n_tok in (8, 16, 32, 128, 512) if quick else (4, 8, 16, 32, 128, 512, 2048):
            x = cupy.asarray(rng.standard_normal((n_tok, n_cols)).astype(np.float32))
            x16 = x.astype(cupy.float16)
            out = cupy.empty((n_tok, n_rows), cupy.float32)
            cublas_only = functools.partial(matmul_t, x16, w16, out)
            dequant_path = functools.partial(matmul_quantized, x16, weight, out.data.ptr, n_rows)
            t_path = time_events(dequant_path, 10)
            t_blas = time_events(cublas_only, 10)
            t_gemv = None
            if n_tok <= GEMV_MAX_TOKENS:
                gemv_call = functools.partial(
                    gemv, weight.data, qtype, weight.row_bytes, n_rows, n_cols, x, out
                )
                t_gemv = time_events(gemv_call, 10)
            dequant_path()
            got = cupy.asnumpy(out)
            ref = cupy.asnumpy(x16.astype(cupy.float32)) @ cupy.asnumpy(w16.astype(cupy.float32)).T
            err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
            flops = 2.0 * n_tok * n_rows * n_cols
            row = {
                "qtype": qtype, "rows": n_rows, "cols": n_cols, "tokens": n_tok,
                "dequant_cublas_us": round(t_path * 1e6, 1), "cublas_f16_us": round(t_blas * 1e6, 1),
                "dequant_us": round(t_deq * 1e6, 1), "gemv_us": None if t_gemv is None else round(t_gemv * 1e6, 1),
                "dequant_cublas_tflops": round(flops / t_path / 1e12, 1),
                "cublas_tflops": round(flops / t_blas / 1e12, 1), "rel_err_vs_f16": err,
            }  # fmt: skip
            results.append(row)
            log(f"  {qtype} [{n_rows}x{n_cols}] T={n_tok}: dequant+cuBLAS {t_path * 1e6:8.1f} us "
                f"({row['dequant_cublas_tflops']} TFLOP/s); cuBLAS alone {t_blas * 1e6:7.1f} us "
                f"({row['cublas_tflops']} TFLOP/s); dequant {t_deq * 1e6:.1f} us; gemv {row['gemv_us']} us; "
                f"err {err:.1e}")  # fmt: skip
    RESULTS["prefill"] = results
    for r in results:
        SUMMARY.append(f"  matmul {r['qtype']} {r['rows']}x{r['cols']} T={r['tokens']}: dequant+cuBLAS "
                       f"{r['dequant_cublas_us']} us (cuBLAS alone {r['cublas_f16_us']}, dequant {r['dequant_us']}, "
                       f"gemv {r['gemv_us']})")  # fmt: skip


# (name, hidden, q rows, kv rows, ffn): the layer shapes of the two targets
FUSED_SHAPES = [("qwen3-0.6b", 1024, 2048, 1024, 3072), ("qwen3-8b", 4096, 4096, 1024, 12288)]


def _rotating(weights: list, want: int = 512 << 20, cap: int = 96) -> list[list[tuple]]:
    """Device copies of a set of weights, as (data, qtype name, row_bytes, rows), enough that
    cycling through them misses the 60 MiB L2 as a decode step does (every layer's weights
    are read once per step)."""
    import cupy

    nbytes = sum(w.data.nbytes for w in weights)
    count = max(2, min(cap, -(-want // nbytes)))
    return [[(w.data if i == 0 else cupy.array(w.data), w.qtype.name, w.row_bytes, w.n_rows) for w in weights]
            for i in range(count)]  # fmt: skip


def fused_bench(quick: bool) -> None:
    """One launch against the unfused launches it replaces, per layer of the two target shapes,
    timed as CUDA-graph replays over weight sets that exceed L2; and, at 32 tokens (concurrency
    32 decode), the float16 weight cache against dequantize-per-call and four 8-token GEMVs."""
    import cupy

    from app.engine.backend.cuda.backend import CudaBackend
    from app.engine.backend.cuda.linear import matmul_quantized
    from app.engine.kernels import activation, gemv, norm, rope, rope_cache
    from app.engine.kernels import kv_cache as kv

    rng = np.random.default_rng(5)
    off = CudaBackend(dense_cache="off")
    on = CudaBackend(dense_cache="on")
    rows_out = []

    def record(shape: str, what: str, n_tok: int, fns_new: list, fns_old: list) -> None:
        """Per layer: `fns_new` is one fused launch per weight set, `fns_old` the unfused launches."""
        t_new, _ = time_graph(fns_new)
        t_old, _ = time_graph(fns_old)
        t_old *= len(fns_old) / len(fns_new)  # time_graph gives seconds per launch
        rows_out.append({"shape": shape, "op": what, "tokens": n_tok, "fused_us": round(t_new * 1e6, 2),
                         "unfused_us": round(t_old * 1e6, 2)})  # fmt: skip
        log(f"  {shape} {what} T={n_tok}: fused {t_new * 1e6:7.2f} us, unfused {t_old * 1e6:7.2f} us")

    for shape, hidden, q_rows, kv_rows, ffn in FUSED_SHAPES[:1] if quick else FUSED_SHAPES:
        qkv_w = [off.load_weight(random_tensor(q, r, hidden, rng)) for q, r in
                 (("Q4_K", q_rows), ("Q4_K", kv_rows), ("Q6_K", kv_rows))]  # fmt: skip
        sets = _rotating(qkv_w)
        ffn_sets = _rotating([off.load_weight(random_tensor("Q4_K", ffn, hidden, rng)) for _ in range(2)])
        for n_tok in (1, 8):
            x = cupy.asarray(rng.standard_normal((n_tok, hidden)).astype(np.float32) * 0.05)
            y = cupy.empty((n_tok, q_rows + 2 * kv_rows), cupy.float32)
            fns_new = [functools.partial(gemv.gemv_multi, ws, hidden, x, y) for ws in sets]
            outs = [cupy.empty((n_tok, r), cupy.float32) for r in (q_rows, kv_rows, kv_rows)]
            fns_old = [functools.partial(gemv.gemv, data, qtype, rb, rows, hidden, x, o)
                       for ws in sets for (data, qtype, rb, rows), o in zip(ws, outs, strict=True)]  # fmt: skip
            record(shape, "qkv gemv", n_tok, fns_new, fns_old)
            g_out = cupy.empty((n_tok, ffn), cupy.float32)
            fns_new = [functools.partial(gemv.gemv_gated, g[:3], u[:3], ffn, hidden, x, "silu", g_out)
                       for g, u in ffn_sets]  # fmt: skip
            gate_o, up_o = cupy.empty_like(g_out), cupy.empty_like(g_out)
            fns_old = []
            for g, u in ffn_sets:
                fns_old += [functools.partial(gemv.gemv, *g, hidden, x, gate_o),
                            functools.partial(gemv.gemv, *u, hidden, x, up_o),
                            functools.partial(activation.gated, gate_o, up_o, "silu", g_out)]  # fmt: skip
            record(shape, "gate/up gemv + silu", n_tok, fns_new, fns_old)
            # QK-norm + RoPE + KV write: 128-dim heads, 16-token blocks
            n_heads, n_kv, d = q_rows // 128, kv_rows // 128, 128
            qkv = cupy.asarray(rng.standard_normal((n_tok, (n_heads + 2 * n_kv) * d)).astype(np.float32))
            cos = cupy.asarray(rng.standard_normal((4096, d // 2)).astype(np.float32))
            sin = cupy.asarray(rng.standard_normal((4096, d // 2)).astype(np.float32))
            k_cache, v_cache = off.alloc_kv_cache(64, 16, n_kv, d)
            pos = cupy.arange(n_tok, dtype=cupy.int32)
            slots = cupy.arange(n_tok, dtype=cupy.int32) * 7
            wq, wk = cupy.ones(d, cupy.float32), cupy.ones(d, cupy.float32)
            q_out = cupy.empty((n_tok, n_heads, d), cupy.float32)
            fused = functools.partial(rope_cache.rope_cache, qkv, n_heads, n_kv, d, wq, wk, 1e-6, pos, cos, sin, False,
                                      k_cache, v_cache, slots, q_out)  # fmt: skip
            q = qkv[:, : n_heads * d].reshape(n_tok, n_heads, d).copy()
            k = qkv[:, n_heads * d : (n_heads + n_kv) * d].reshape(n_tok, n_kv, d).copy()
            v = qkv[:, (n_heads + n_kv) * d :].reshape(n_tok, n_kv, d).copy()
            qn, kn, qr, kr = (cupy.empty_like(a) for a in (q, k, q, k))
            unfused = [functools.partial(norm.rms_norm, q, wq, 1e-6, qn), functools.partial(norm.rms_norm, k, wk, 1e-6, kn),
                       functools.partial(rope.rope, qn, pos, cos, sin, False, qr),
                       functools.partial(rope.rope, kn, pos, cos, sin, False, kr),
                       functools.partial(kv.write_kv, k_cache, v_cache, kr, v, slots)]  # fmt: skip
            record(shape, "qk-norm + rope + kv write", n_tok, [fused] * 8, unfused * 8)
        # Launch shapes of the fused kernels at one token (defaults: R 4 / RH 2, warps by width).
        x1 = cupy.asarray(rng.standard_normal((1, hidden)).astype(np.float32) * 0.05)
        g1 = cupy.empty((1, ffn), cupy.float32)
        y1 = cupy.empty((1, q_rows + 2 * kv_rows), cupy.float32)
        for warps in (1, 2, 4, 8):
            for half in (1, 2, 4):
                t, _ = time_graph([functools.partial(gemv.gemv_gated, g[:3], u[:3], ffn, hidden, x1, "silu", g1,
                                                     half, warps) for g, u in ffn_sets])  # fmt: skip
                rows_out.append({"shape": shape, "op": "gate/up variant", "warps": warps, "rows_half": half,
                                 "us": round(t * 1e6, 2)})  # fmt: skip
            for rows in (2, 4, 8):
                t, _ = time_graph([functools.partial(gemv.gemv_multi, ws, hidden, x1, y1, None, rows, warps)
                                   for ws in sets])  # fmt: skip
                rows_out.append({"shape": shape, "op": "qkv variant", "warps": warps, "rows": rows,
                                 "us": round(t * 1e6, 2)})  # fmt: skip
        variants = [r for r in rows_out if r["shape"] == shape and r["op"].endswith("variant")]
        for op in ("gate/up variant", "qkv variant"):
            best = min((r for r in variants if r["op"] == op), key=lambda r: r["us"])
            log(f"  {shape} {op} best at T=1: {best}")
        # 32 tokens: float16 cache vs dequantize per call vs four 8-token GEMVs (the down projection)
        down = random_tensor("Q4_K", hidden, ffn, rng)
        w_off, w_on = off.load_weight(down), on.load_weight(down)
        x32 = cupy.asarray(rng.standard_normal((32, ffn)).astype(np.float32))
        x16 = x32.astype(cupy.float16)
        out = cupy.empty((32, hidden), cupy.float32)
        outs8 = [cupy.empty((8, hidden), cupy.float32) for _ in range(4)]
        t_cached, _ = time_graph([functools.partial(matmul_quantized, x16, w_on, out.data.ptr, hidden)] * 8)
        t_dequant, _ = time_graph([functools.partial(matmul_quantized, x16, w_off, out.data.ptr, hidden)] * 8)
        t_gemv, _ = time_graph([functools.partial(gemv.gemv, w_off.data, "Q4_K", w_off.row_bytes, hidden, ffn,
                                                  x32[8 * i : 8 * i + 8], outs8[i]) for i in range(4)] * 8)  # fmt: skip
        t_gemv *= 4
        rows_out.append({"shape": shape, "op": "down T=32", "f16_cache_us": round(t_cached * 1e6, 2),
                         "dequant_cublas_us": round(t_dequant * 1e6, 2), "gemv_4x8_us": round(t_gemv * 1e6, 2)})  # fmt: skip
        log(f"  {shape} down [{hidden}x{ffn}] T=32: f16 cache {t_cached * 1e6:.1f} us, dequant+cuBLAS "
            f"{t_dequant * 1e6:.1f} us, 4 x GEMV T=8 {t_gemv * 1e6:.1f} us")  # fmt: skip
        best = {op: min((r for r in rows_out if r["shape"] == shape and r["op"] == op), key=lambda r: r["us"])
                for op in ("gate/up variant", "qkv variant")}  # fmt: skip
        for op, r in best.items():
            SUMMARY.append(f"  {shape} {op} best at T=1: {r['us']} us (warps {r['warps']}, "
                           f"rows {r.get('rows', r.get('rows_half'))})")  # fmt: skip
        del sets, ffn_sets, qkv_w
        cupy.get_default_memory_pool().free_all_blocks()
    RESULTS["fused"] = rows_out
    for r in rows_out:
        if r["op"].endswith("variant"):
            continue
        if "fused_us" in r:
            SUMMARY.append(
                f"  {r['shape']} {r['op']} T={r['tokens']}: fused {r['fused_us']} us vs {r['unfused_us']} us"
            )
        else:
            SUMMARY.append(f"  {r['shape']} {r['op']}: f16 cache {r['f16_cache_us']} us, dequant+cuBLAS "
                           f"{r['dequant_cublas_us']} us, 4 x GEMV(8) {r['gemv_4x8_us']} us")  # fmt: skip


def _attention_setup(
    backend, rng, n_seqs: int, ctx: int, n_q: int, heads: tuple[int, int, int], block_size: int = 16
):
    import cupy

    from app.engine.backend.base import AttentionMetadata

    n_heads, n_kv, head_dim = heads
    per_seq = -(-ctx // block_size)
    num_blocks = n_seqs * per_seq
    k_cache, v_cache = backend.alloc_kv_cache(num_blocks, block_size, n_kv, head_dim)
    k_cache[...] = cupy.random.standard_normal(k_cache.shape, dtype=cupy.float32).astype(cupy.float16)
    v_cache[...] = cupy.random.standard_normal(v_cache.shape, dtype=cupy.float32).astype(cupy.float16)
    tables = rng.permutation(num_blocks).astype(np.int32).reshape(n_seqs, per_seq)
    qsl = (np.arange(n_seqs + 1) * n_q).astype(np.int32)
    seq_lens = np.full(n_seqs, ctx, np.int32)
    n_tok = n_seqs * n_q
    meta = AttentionMetadata(
        query_start_loc=cupy.asarray(qsl), seq_lens=cupy.asarray(seq_lens), block_tables=cupy.asarray(tables),
        slot_mapping=cupy.zeros(n_tok, cupy.int32), positions=cupy.zeros(n_tok, cupy.int32),
        max_query_len=n_q, max_seq_len=ctx, block_size=block_size, host_query_start_loc=qsl, host_seq_lens=seq_lens,
    )  # fmt: skip
    q = cupy.asarray(rng.standard_normal((n_tok, n_heads, head_dim)).astype(np.float32))
    return q, k_cache, v_cache, meta


def attention_bench(quick: bool) -> None:
    import cupy

    from app.engine.backend.cuda.backend import CudaBackend
    from app.engine.kernels.attention import attention as attention_kernel
    from app.engine.kernels.attention import plan_splits

    backend = CudaBackend()
    copy_gbs = float(RESULTS.get("copy_gbs") or 4300.0)
    rng = np.random.default_rng(2)
    results = []
    shapes = {"qwen3-8b": (32, 8, 128), "gemma3-270m": (4, 1, 256)}
    for shape_name, heads in shapes.items():
        for n_seqs in (1, 16) if not quick else (1,):
            for ctx in (512, 4096, 32768):
                q, kc, vc, meta = _attention_setup(backend, rng, n_seqs, ctx, 1, heads)
                scale = heads[2] ** -0.5
                plan = plan_splits(q.shape[0], heads[1], ctx, backend.sm_count, heads[0], heads[2])
                out = cupy.empty_like(q)
                kv_bytes = 2 * n_seqs * ctx * heads[1] * heads[2] * 2
                for min_blocks in (1, 4):
                    call = functools.partial(
                        attention_kernel, q, kc, vc, meta.query_start_loc, meta.seq_lens, meta.block_tables,
                        scale, None, None, plan, out, min_blocks,
                    )  # fmt: skip
                    t_ev = time_events(call, 20)
                    t_graph, how = time_graph([call] * 20)
                    best = min(t_ev, t_graph)
                    row = {
                        "shape": shape_name, "seqs": n_seqs, "ctx": ctx, "splits": plan.num_splits,
                        "min_blocks": min_blocks, "us_events": round(t_ev * 1e6, 2), "us_graph": round(t_graph * 1e6, 2),
                        "graph": how, "kv_gbs": round(kv_bytes / best / 1e9, 1),
                        "frac_copy": round(kv_bytes / best / 1e9 / copy_gbs, 3),
                    }  # fmt: skip
                    results.append(row)
                    log(f"  {shape_name} decode seqs={n_seqs} ctx={ctx} splits={plan.num_splits} minb={min_blocks}: "
                        f"events {t_ev * 1e6:8.1f} us, graph {t_graph * 1e6:8.1f} us, "
                        f"KV {row['kv_gbs']} GB/s ({row['frac_copy']:.0%} of copy)")  # fmt: skip
                del q, kc, vc, meta, call, out
                cupy.get_default_memory_pool().free_all_blocks()
        q, kc, vc, meta = _attention_setup(backend, rng, 1, 2048, 2048, heads)
        t = time_events(functools.partial(backend.attention, q, kc, vc, meta, 0.1), 3, 3)
        flops = 4.0 * heads[0] * heads[2] * 2048 * 2048 / 2
        results.append(
            {
                "shape": shape_name,
                "prefill_tokens": 2048,
                "us": round(t * 1e6, 1),
                "tflops": round(flops / t / 1e12, 2),
            }
        )
        log(f"  {shape_name} prefill 2048 tokens: {t * 1e3:.2f} ms ({flops / t / 1e12:.2f} TFLOP/s causal)")
        del q, kc, vc, meta
    RESULTS["attention"] = results
    for r in results:
        if "ctx" in r:
            SUMMARY.append(f"  attn {r['shape']} seqs={r['seqs']} ctx={r['ctx']} minb={r['min_blocks']}: "
                           f"{min(r['us_events'], r['us_graph'])} us, KV {r['kv_gbs']} GB/s ({r['frac_copy']:.0%})")  # fmt: skip
        else:
            SUMMARY.append(f"  attn {r['shape']} prefill 2048: {r['us']} us ({r['tflops']} TFLOP/s)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench/results/raw")))
    parser.add_argument("--no-tests", action="store_true", help="skip the pytest stages")
    parser.add_argument("--quick", action="store_true", help="fewer variants and sizes")
    parser.add_argument("--only", default="", help="comma-separated stages to run (default: all)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PADDOCK_KERNEL_CACHE", str(args.out.parent / "paddock-kernel-cache"))
    RESULTS_PATH.append(args.out / "results.json")
    t0 = time.time()
    stages: list[tuple[str, Callable[[], None]]] = [
        ("device", device_facts),
        ("tests", lambda: run_tests(args.out)),
        ("copy bandwidth", copy_bandwidth),
        ("gemv", lambda: gemv_bench(args.quick)),
        ("fused", lambda: fused_bench(args.quick)),
        ("prefill matmul", lambda: prefill_bench(args.quick)),
        ("attention", lambda: attention_bench(args.quick)),
    ]
    only = {name.strip() for name in args.only.split(",") if name.strip()}
    for name, fn in stages:
        if (name == "tests" and args.no_tests) or (only and name not in only):
            continue
        stage(name, fn)
    RESULTS["seconds"] = round(time.time() - t0, 1)
    (args.out / "results.json").write_text(json.dumps(RESULTS, indent=1, default=str))
    log("\n=== summary ===")
    log("\n".join(SUMMARY))
    log(f"total {time.time() - t0:.0f} s; full numbers in {args.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
