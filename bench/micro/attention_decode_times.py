"""Decode attention alone (attention_decode.cu), one sequence at the Qwen3-8B head shape, timed
as CUDA-graph replays of back-to-back launches (H200): where its time goes at short contexts.

    python3 bench/micro/attention_decode_times.py

One line per (context, blocks per KV head): microseconds per launch. One block over several
chunks against one chunk per block shows the per-chunk cost; one chunk alone the floor; the
difference between one active block and several the cost of merging their partials.
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


def main() -> None:
    import cupy

    backend = CudaBackend()
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
