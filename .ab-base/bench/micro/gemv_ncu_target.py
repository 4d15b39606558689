"""A fixed set of single-token GEMV launches at the Qwen3-8B layer shapes, for Nsight Compute:

    ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section Occupancy --section WarpStateStats -k regex:gemv python3 bench/micro/gemv_ncu_target.py

Each kernel runs three times (the first compiles); ncu flushes the caches between its passes, so
the weights come from HBM as in a decode step.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "suite"))

from gpu_check import random_tensor

from app.engine.backend.cuda.backend import CudaBackend
from app.engine.kernels import gemv


def main() -> None:
    import cupy

    backend = CudaBackend(dense_cache="off")
    rng = np.random.default_rng(0)
    hidden, ffn = 4096, 12288
    x = cupy.asarray(rng.standard_normal((1, hidden)).astype(np.float32))
    x_ffn = cupy.asarray(rng.standard_normal((1, ffn)).astype(np.float32))
    gate, up = (backend.load_weight(random_tensor("Q4_K", ffn, hidden, rng)) for _ in range(2))
    down = backend.load_weight(random_tensor("Q6_K", hidden, ffn, rng))
    g_out = cupy.empty((1, ffn), cupy.float32)
    d_out = cupy.empty((1, hidden), cupy.float32)
    for _ in range(3):
        gemv.gemv_gated((gate.data, "Q4_K", gate.row_bytes), (up.data, "Q4_K", up.row_bytes), ffn, hidden, x,
                        "silu", g_out)  # fmt: skip
        gemv.gemv(down.data, "Q6_K", down.row_bytes, hidden, ffn, x_ffn, d_out)
        gemv.gemv(gate.data, "Q4_K", gate.row_bytes, ffn, hidden, x, g_out)
    cupy.cuda.Device().synchronize()


if __name__ == "__main__":
    main()
