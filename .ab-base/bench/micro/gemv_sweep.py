"""Single-token GEMV launch shapes on the Qwen3 layer matrices: warps per block and rows per
block for the fused q/k/v, gate/up and the single down / o products, timed as CUDA-graph
replays over weight copies that miss L2 (as a decode step does). Prints one JSON line per
(op, shape) with microseconds per launch for each setting and the fraction of copy bandwidth.

    python3 bench/micro/gemv_sweep.py          # the float32-x kernels: warps x rows per block
    python3 bench/micro/gemv_sweep.py --int    # the int16-x kernels (gemv_int.py) against the float32-x
                                         # default: rows per warp x warps x blocks per SM x units per step
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "suite"))

from gpu_check import _rotating, random_tensor, time_graph

from app.engine.backend.cuda.backend import CudaBackend
from app.engine.kernels import gemv, gemv_int

# (name, hidden, q rows, k/v rows, ffn): the Qwen3 shapes the tables were tuned on, then the wider layers of the
# 27B-31B models (their full-attention layers; only with SWEEP_SHAPES)
SHAPES = [("qwen3-0.6b", 1024, 2048, 1024, 3072), ("qwen3-8b", 4096, 4096, 1024, 12288)]
WIDE_SHAPES = [("qwen35-27b", 5120, 12288, 1024, 17408), ("gemma4-31b", 5376, 8192, 4096, 21504)]
WARPS = (1, 2, 4, 8)
COPY_GBS = 4280.0


def sweep(label: str, nbytes: int, sets: list, build, settings) -> None:
    """Time `build(weight_set, *setting)` over every weight set for each setting."""
    row: dict = {"op": label, "mb": round(nbytes / 1e6, 1)}
    best = None
    for setting in settings:
        seconds, _ = time_graph([build(ws, *setting) for ws in sets])
        us = round(seconds * 1e6, 2)
        row[str(setting)] = us
        best = min(best or (us, setting), (us, setting), key=lambda pair: pair[0])  # ties: the first
    row["best"] = f"{best[1]} {best[0]} us, {nbytes / best[0] / 1e3 / COPY_GBS:.0%} of copy"
    print(json.dumps(row), flush=True)


def _qkv_case(backend, rng, hidden: int, q_rows: int, kv_rows: int):
    """One token of x, the Q4_K_M q/k/v weights (Q6_K v) of a layer, and their output."""
    import cupy

    x = cupy.asarray(rng.standard_normal((1, hidden)).astype(np.float32))
    qkv = [backend.load_weight(random_tensor(q, r, hidden, rng)) for q, r in
           (("Q4_K", q_rows), ("Q4_K", kv_rows), ("Q6_K", kv_rows))]  # fmt: skip
    return x, qkv, cupy.empty((1, q_rows + 2 * kv_rows), cupy.float32)


INT_SETTINGS = [(r, w, b, u) for r in (1, 2, 4) for w in (4, 8) for b in (4,) for u in (1, 2)]
# SWEEP_INT="1,8,4,1 2,8,4,2": only these (rows, warps, blocks per SM, units); SWEEP_SHAPES="qwen3-8b": only these shapes
if os.environ.get("SWEEP_INT"):
    INT_SETTINGS = [tuple(int(v) for v in item.split(",")) for item in os.environ["SWEEP_INT"].split()]
if os.environ.get("SWEEP_SHAPES"):
    SHAPES = [s for s in SHAPES + WIDE_SHAPES if s[0] in os.environ["SWEEP_SHAPES"].split()]


def int_sweep() -> None:
    """The int16-x kernels at every INT_SETTINGS shape; "float" is today's float32-x default."""
    import cupy

    backend = CudaBackend(dense_cache="off")
    rng = np.random.default_rng(0)
    for shape, hidden, q_rows, kv_rows, ffn in SHAPES:
        x, qkv, y = _qkv_case(backend, rng, hidden, q_rows, kv_rows)

        def multi(ws, *setting, x=x, y=y, hidden=hidden):
            if setting == ("float",):
                return functools.partial(gemv.gemv_multi, ws, hidden, x, y, None, gemv.fused_rows(1), None)
            return functools.partial(gemv_int.gemv_int_multi, ws, hidden, x, y, None, *setting)

        sweep(
            f"{shape} qkv",
            sum(w.data.nbytes for w in qkv),
            _rotating(qkv),
            multi,
            [("float",), *INT_SETTINGS],
        )
        ffn_w = [backend.load_weight(random_tensor("Q4_K", ffn, hidden, rng)) for _ in range(2)]
        g = cupy.empty((1, ffn), cupy.float32)

        def gated(ws, *setting, x=x, g=g, hidden=hidden, ffn=ffn):
            if setting == ("float",):
                return functools.partial(
                    gemv.gemv_gated, ws[0][:3], ws[1][:3], ffn, hidden, x, "silu", g, 2, None
                )
            return functools.partial(
                gemv_int.gemv_int_gated, ws[0][:3], ws[1][:3], ffn, hidden, x, 0, g, *setting
            )

        sweep(f"{shape} gate_up", sum(w.data.nbytes for w in ffn_w), _rotating(ffn_w), gated,
              [("float",), *INT_SETTINGS])  # fmt: skip
        for name, qtype, rows, cols in (("o", "Q4_K", hidden, q_rows), ("down", "Q4_K", hidden, ffn),
                                        ("down", "Q6_K", hidden, ffn)):  # fmt: skip
            weight = backend.load_weight(random_tensor(qtype, rows, cols, rng))
            xi = cupy.asarray(rng.standard_normal((1, cols)).astype(np.float32))
            out = cupy.empty((1, rows), cupy.float32)

            def single(ws, *setting, xi=xi, out=out, rows=rows, cols=cols):
                data, qtype_name, row_bytes, _ = ws[0]
                if setting == ("float",):
                    r = gemv.default_rows(1, qtype_name)
                    return functools.partial(
                        gemv.gemv, data, qtype_name, row_bytes, rows, cols, xi, out, None, None, r
                    )
                return functools.partial(gemv_int.gemv_int, data, qtype_name, row_bytes, rows, cols, xi, out, None,
                                         *setting)  # fmt: skip

            sweep(f"{shape} {name} {qtype}", weight.data.nbytes, _rotating([weight]), single,
                  [("float",), *INT_SETTINGS])  # fmt: skip
        cupy.get_default_memory_pool().free_all_blocks()


def write_tuning(arch: str, best: dict[tuple[str, str, int], tuple[int, int, int, int]]) -> Path:
    """Write the best int16-x shapes of a sweep, {(kernel, first format, columns): (rows, warps,
    units, min_blocks)} with kernel SINGLE, GATED or MULTI, as app/engine/kernels/tuning/sm<arch>.json
    (only what differs from the shipped tables; tests/engine/test_tuning.py checks the format)."""
    from app.engine.kernels import tuning

    return tuning.write_overlay(arch, {key: tuning.LaunchShape(*shape) for key, shape in best.items()})


def main() -> None:
    if "--int" in sys.argv:
        int_sweep()
        return
    import cupy

    backend = CudaBackend(dense_cache="off")
    rng = np.random.default_rng(0)
    for shape, hidden, q_rows, kv_rows, ffn in SHAPES:
        x, qkv, y = _qkv_case(backend, rng, hidden, q_rows, kv_rows)

        def multi(ws, r, w, x=x, y=y, hidden=hidden):
            return functools.partial(gemv.gemv_multi, ws, hidden, x, y, None, r, w)

        sweep(f"{shape} qkv", sum(w.data.nbytes for w in qkv), _rotating(qkv), multi,
              [(r, w) for r in (2, 4, 8) for w in WARPS])  # fmt: skip
        ffn_w = [backend.load_weight(random_tensor("Q4_K", ffn, hidden, rng)) for _ in range(2)]
        g = cupy.empty((1, ffn), cupy.float32)

        def gated(ws, r, w, x=x, g=g, hidden=hidden, ffn=ffn):
            return functools.partial(gemv.gemv_gated, ws[0][:3], ws[1][:3], ffn, hidden, x, "silu", g, r, w)

        sweep(f"{shape} gate_up", sum(w.data.nbytes for w in ffn_w), _rotating(ffn_w), gated,
              [(r, w) for r in (1, 2, 4, 8) for w in WARPS])  # fmt: skip
        for name, qtype, rows, cols in (("o", "Q4_K", hidden, q_rows), ("down", "Q4_K", hidden, ffn),
                                        ("down", "Q6_K", hidden, ffn)):  # fmt: skip
            weight = backend.load_weight(random_tensor(qtype, rows, cols, rng))
            xi = cupy.asarray(rng.standard_normal((1, cols)).astype(np.float32))
            out = cupy.empty((1, rows), cupy.float32)

            def single(ws, r, w, xi=xi, out=out, rows=rows, cols=cols):
                data, qtype_name, row_bytes, _ = ws[0]
                return functools.partial(
                    gemv.gemv, data, qtype_name, row_bytes, rows, cols, xi, out, None, w, r
                )

            sweep(f"{shape} {name} {qtype}", weight.data.nbytes, _rotating([weight]), single,
                  [(r, w) for r in gemv.VARIANTS[1] for w in WARPS])  # fmt: skip
        cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
