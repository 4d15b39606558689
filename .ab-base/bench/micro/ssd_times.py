"""Mamba-2's scan alone (ssd.cu through backend.ssd_scan), at Nemotron-H 8B's mixer shape (128 heads of
64, 8 groups, d_state 128), timed as CUDA-graph replays of back-to-back launches: what a layer's scan
costs at decode and in a prefill chunk, the figure that says whether the token-sequential prefill
walk needs the chunked (matrix) form.

    python3 bench/micro/ssd_times.py

One JSON line per case: microseconds per launch, the state bytes read and written per second (decode:
the scan streams every sequence's [H, P, N] state in and out) and, for prefill, tokens per second.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "suite"))

from gpu_check import time_graph

from app.engine.backend.base import AttentionMetadata
from app.engine.backend.cuda.backend import CudaBackend

HEADS, HEAD_DIM, GROUPS, STATE = 128, 64, 8, 128  # Nemotron-H 8B
DECODE_BATCHES = (1, 8, 32)
PREFILL = ((1, 512), (1, 2048), (1, 8192), (8, 512))  # (sequences, tokens each)


def _case(backend: CudaBackend, rng: np.random.Generator, lengths: list[int]) -> functools.partial:
    """One ssd_scan call over a batch of `lengths`, inputs laid out as the layer hands them over."""
    n, inner, gn = sum(lengths), HEADS * HEAD_DIM, GROUPS * STATE
    xbc = backend.from_host(rng.standard_normal((n, inner + 2 * gn)).astype(np.float32))
    dt = backend.from_host(rng.normal(-2, 1, (n, HEADS)).astype(np.float32))
    params = [backend.from_host(v.astype(np.float32)) for v in (rng.normal(0, 0.5, HEADS),
              -np.exp(rng.uniform(-1, 1, HEADS)), rng.standard_normal(HEADS))]  # fmt: skip
    state = backend.xp.zeros((len(lengths) + 1, HEADS, HEAD_DIM, STATE), backend.xp.float32)
    qsl = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=qsl[1:])
    seq_lens = np.array(lengths, np.int32)
    meta = AttentionMetadata(
        backend.from_host(qsl), backend.from_host(seq_lens), None, None, None, max(lengths), max(lengths), 16,
        state_slots=backend.from_host(np.arange(1, len(lengths) + 1, dtype=np.int32)),
        has_initial_state=backend.from_host(np.ones(len(lengths), bool)),
    )  # fmt: skip
    x = xbc[:, :inner].reshape(n, HEADS, HEAD_DIM)
    b = xbc[:, inner : inner + gn].reshape(n, GROUPS, STATE)
    c = xbc[:, inner + gn :].reshape(n, GROUPS, STATE)
    return functools.partial(backend.ssd_scan, x, dt, params[0], params[1], b, c, params[2], state, meta, 256)


def main() -> None:
    backend = CudaBackend()
    rng = np.random.default_rng(0)
    state_bytes = HEADS * HEAD_DIM * STATE * 4
    for batch in DECODE_BATCHES:
        seconds, how = time_graph([_case(backend, rng, [1] * batch)] * 20)
        print(json.dumps({"case": "decode", "seqs": batch, "us": round(seconds * 1e6, 2), "timing": how,
                          "state_tb_s": round(2 * batch * state_bytes / seconds / 1e12, 2)}), flush=True)  # fmt: skip
    for n_seqs, tokens in PREFILL:
        seconds, how = time_graph([_case(backend, rng, [tokens] * n_seqs)] * 3)
        print(json.dumps({"case": "prefill", "seqs": n_seqs, "tokens": tokens, "us": round(seconds * 1e6, 1),
                          "timing": how, "tokens_per_s": round(n_seqs * tokens / seconds)}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
