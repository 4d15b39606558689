"""What the products of one step cost at 1..16 activation rows on the CPU (numba) kernels: every matrix of
the embedded Gemma 3 270M once (the tied LM head included), through `gemv` (each weight row decoded again
per activation row) and `gemm_rows` (decoded once for all rows), best of 5 per matrix. The ratio to one
row is what a speculative verify step of that many rows costs in decode steps of products; best-of timing
keeps it steadier than end-to-end tok/s on a shared machine.

    .venv/bin/python bench/lab/cpu_step_products.py
"""

from __future__ import annotations

import time

import numpy as np

from app.engine.backend.cpu_fast import kernels
from app.engine.backend.cpu_fast.weights import FAST_FORMATS, FastWeight, half_table
from app.engine.loader.embedded import embedded_gguf_path
from app.engine.loader.gguf import read_gguf

ROWS = (1, 2, 4, 8, 12, 16)


def best(kernel, *args, repeats: int = 5) -> float:
    kernel(*args)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        kernel(*args)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    f16 = half_table()
    matrices = []
    for tensor in read_gguf(embedded_gguf_path()).tensors.values():
        if len(tensor.shape) == 2 and tensor.qtype.name in FAST_FORMATS:
            weight = FastWeight(tensor)
            matrices.append((weight.kernels, weight.data, weight.shape))
    one = None
    for rows in ROWS:
        per_row = once = 0.0
        for k, data, (n_out, n_in) in matrices:
            x = np.random.default_rng(rows).standard_normal((rows, n_in)).astype(np.float32)
            sums = x.reshape(rows, -1, kernels.GROUP).sum(-1)
            out = np.empty((rows, n_out), np.float32)
            per_row += best(k.gemv, data, f16, x, sums, out, 0, kernels.GROUP)
            once += best(k.gemm_rows, data, f16, x, out, 0, kernels.GROUP)
        one = one or per_row
        print(f"{rows:2d} rows: gemv {per_row * 1e3:7.1f} ms ({per_row / one:5.2f} steps)   "
              f"gemm_rows {once * 1e3:7.1f} ms ({once / one:5.2f} steps)", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
