"""Decode attention at one sequence: the split plan a decode graph uses (planned for the longest
context) against plans fitted to the actual context, timed inside CUDA graphs (H200).

    python3 bench/micro/attention_plans.py
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
from app.engine.kernels.attention import SplitPlan, attention, plan_splits
from app.engine.kernels.runtime.launch import cdiv

MAX_LEN = 4096


def main() -> None:
    import cupy

    backend = CudaBackend()
    rng = np.random.default_rng(0)
    for name, heads in {"qwen3-8b": (32, 8, 128), "qwen3-0.6b": (16, 8, 128)}.items():
        for ctx in (330, 1000, 4000):
            q, kc, vc, meta = _attention_setup(backend, rng, 1, ctx, 1, heads)
            out = cupy.empty_like(q)
            graph_plan = plan_splits(1, heads[1], MAX_LEN, backend.sm_count, heads[0], heads[2])
            plans = {"graph": graph_plan, "fitted": plan_splits(1, heads[1], ctx, backend.sm_count, *heads[::2])}
            for n in (1, 2, 4, 8, 16):
                length = cdiv(cdiv(ctx, n), 32) * 32
                plans[f"{n} splits"] = SplitPlan(cdiv(ctx, length), length if n > 1 else 1 << 30, graph_plan.min_blocks)
            row = {"shape": name, "ctx": ctx}
            for label, plan in plans.items():
                call = functools.partial(attention, q, kc, vc, meta.query_start_loc, meta.seq_lens,
                                         meta.block_tables, heads[2] ** -0.5, None, None, plan, out)  # fmt: skip
                seconds, _how = time_graph([call] * 20)
                row[f"{label} ({plan.num_splits}x{min(plan.split_len, ctx)})"] = round(seconds * 1e6, 2)
            print(json.dumps(row), flush=True)
            del q, kc, vc, meta, out
            cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
