"""The routed experts of one Qwen3.5-35B-A3B layer in prefill: moe.cu's moe_grouped (CUDA cores, each
expert's weights re-read every 4 of its pairs) against moe_mma.cu (tensor cores, 64 pairs a tile), on
the GPU machine.

The layer: 256 experts, top 8, hidden 2048, expert_ffn 512; gate and up Q4_K, down Q6_K (as the Q4_K_M
files' layers that keep down at 6 bits) or Q4_K. Each token's 8 experts are drawn uniformly (a trained
router is less even: more pairs on some experts, fewer on others), grouped on the host as moe_scatter
groups them on the device.

    python3 bench/micro/moe_prefill_times.py                 # 512, 2,048 and 8,192 tokens
    python3 bench/micro/moe_prefill_times.py --tokens 8192

Prints one JSON line per (tokens, product): microseconds per call of each kernel (the new one with the
tile shape it picks, and with each shape), TFLOP/s (2 x pairs x rows x columns per call), the speed-up
and the new kernel's relative difference from the old (norm of the difference over the old's norm);
then one line per token count for the whole experts (moe_experts: gate, up, gated unit, down, combine)
on each path.
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
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "engine" / "cuda"))

from cuda_samples import pair_groups, random_tensor
from gpu_check import time_events

from app.engine.kernels import moe_mma
from app.engine.kernels.moe import PairGroups, StackedExperts, grouped_product, moe_experts, upload_stacked
from app.engine.models.config import MoeSpec
from app.engine.quant.dispatch import QuantizedTensor

EXPERTS, USED, HIDDEN, FFN = 256, 8, 2048, 512
# (product, format, rows, columns, inputs per pair): the grouped products of one layer
PRODUCTS = (("up", "Q4_K", FFN, HIDDEN, False), ("down", "Q6_K", HIDDEN, FFN, True), ("down", "Q4_K", HIDDEN, FFN, True))


def stacked(qtype: str, rows: int, cols: int, rng: np.random.Generator) -> StackedExperts:
    flat = random_tensor(qtype, EXPERTS * rows, cols, rng)
    return upload_stacked(QuantizedTensor("w", flat.qtype, (EXPERTS, rows, cols), flat.data))


def routing(n_tok: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each token's USED distinct experts and weights, and the pairs' `order` and `offsets`."""
    chosen = np.argsort(rng.random((n_tok, EXPERTS)), axis=1)[:, :USED].astype(np.int32)
    weights = rng.dirichlet(np.ones(USED), n_tok).astype(np.float32)
    order = np.argsort(chosen.reshape(-1), kind="stable").astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(np.bincount(chosen.reshape(-1), minlength=EXPERTS))]).astype(np.int32)
    return chosen, weights, order, offsets


def grouped_old(w: StackedExperts, x, per_pair: bool, plan: PairGroups, y) -> None:
    y[...] = grouped_product(w, x, plan, per_pair)


def measure_products(n_tok: int, weights: dict, rng: np.random.Generator) -> None:
    import cupy as cp

    _, _, order, offsets = routing(n_tok, rng)
    d_order, d_offsets = cp.asarray(order), cp.asarray(offsets)
    pairs = n_tok * USED
    for name, qtype, rows, cols, per_pair in PRODUCTS:
        w = weights[name, qtype]
        x = cp.asarray(rng.standard_normal((pairs if per_pair else n_tok, cols)).astype(np.float32))
        y_old, y_new = cp.empty((pairs, rows), cp.float32), cp.empty((pairs, rows), cp.float32)
        plan = pair_groups(cp.asnumpy(d_order), cp.asnumpy(d_offsets), USED)
        old_s = time_events(partial(grouped_old, w, x, per_pair, plan, y_old), iters=5)
        shapes = {}  # each tile shape's time: pick_shape's choice is checked against the other
        for shape in (moe_mma.SQUARE, moe_mma.FEW_PAIRS):
            run = partial(moe_mma.grouped_mma, w, x, per_pair, d_order, d_offsets, USED, EXPERTS, y_new, shape)
            shapes[f"{shape.pairs}x{shape.rows}"] = time_events(run)
        picked = moe_mma.pick_shape(pairs, EXPERTS)
        new_s = shapes[f"{picked.pairs}x{picked.rows}"]
        flop = 2.0 * pairs * rows * cols
        diff = float(cp.linalg.norm(y_new - y_old) / cp.linalg.norm(y_old))
        print(json.dumps({
            "tokens": n_tok, "product": name, "format": qtype, "rows": rows, "cols": cols, "pairs": pairs,
            "tile": f"{picked.pairs}x{picked.rows}", "old_us": round(old_s * 1e6, 1), "new_us": round(new_s * 1e6, 1),
            **{f"tile_{key}_us": round(t * 1e6, 1) for key, t in shapes.items()},
            "old_tflops": round(flop / old_s / 1e12, 2), "new_tflops": round(flop / new_s / 1e12, 2),
            "speedup": round(old_s / new_s, 2), "rel_diff": float(f"{diff:.3g}"),
        }), flush=True)  # fmt: skip


def measure_experts(n_tok: int, weights: dict, rng: np.random.Generator) -> None:
    """moe_experts whole on the old path (the tensor cores' threshold out of reach) and on the new one."""
    import cupy as cp

    chosen, route_weights, _, _ = routing(n_tok, rng)
    spec = MoeSpec(EXPERTS, USED, FFN)
    x = cp.asarray(rng.standard_normal((n_tok, HIDDEN)).astype(np.float32))
    args = (x, cp.asarray(chosen), cp.asarray(route_weights), spec, weights["gate", "Q4_K"], weights["up", "Q4_K"],
            weights["down", "Q6_K"])  # fmt: skip
    threshold = moe_mma.MIN_PAIRS_PER_EXPERT
    moe_mma.MIN_PAIRS_PER_EXPERT = 1 << 30
    old_s = time_events(lambda: moe_experts(*args), iters=3, reps=3)
    moe_mma.MIN_PAIRS_PER_EXPERT = threshold
    new_s = time_events(lambda: moe_experts(*args), iters=5)
    flop = 2.0 * n_tok * USED * 3 * FFN * HIDDEN
    print(json.dumps({
        "tokens": n_tok, "product": "moe_experts", "old_us": round(old_s * 1e6, 1), "new_us": round(new_s * 1e6, 1),
        "old_tflops": round(flop / old_s / 1e12, 2), "new_tflops": round(flop / new_s / 1e12, 2),
        "speedup": round(old_s / new_s, 2), "layers_40_new_ms": round(40 * new_s * 1e3, 1),
    }), flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, nargs="*", default=[512, 2048, 8192])
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    weights = {("gate", "Q4_K"): stacked("Q4_K", FFN, HIDDEN, rng)}
    for name, qtype, rows, cols, _ in PRODUCTS:
        weights[name, qtype] = stacked(qtype, rows, cols, rng)
    for n_tok in args.tokens:
        measure_products(n_tok, weights, rng)
        measure_experts(n_tok, weights, rng)


if __name__ == "__main__":
    main()
