"""float16 copies of quantized matrices: memory traded for speed above GEMV_MAX_TOKENS.

Decode of up to GEMV_MAX_TOKENS tokens reads the quantized blocks (bandwidth-bound, one
pass). Above that cuBLAS takes float16 weights; without a copy, 3..64 rows (a decode step of
that many sequences) go to gemv_mma.cu on the quantized blocks (linear.py), and larger products
(prefill) expand the weight again each call (a write and a read of 2 bytes per weight on top of
the product, 3.9x the time of cuBLAS alone at 32 tokens on the H200: docs/tuning-log.md). With a
copy the product reads it once.

Policy, decided per matrix as the backend takes it (the engine loads every weight
before it sizes the KV cache, so the cache is paid for out of the same free memory):

- "off": never.
- "on": every matrix, embedding tables included.
- "auto": projections while the copies stay within DENSE_FRACTION of the free memory
  the backend found at start; past that, or when an allocation fails, the matrix keeps
  only its blocks. Load order decides who is cached first: every projection is equally
  hot (each decode step reads all of them), so no reordering would pay for holding every
  weight until the end. Embedding tables are cold (one row read per token) unless the
  output head shares them (tied embeddings): they get their copy on their first product
  that would expand them (above the rows linear.py sends to gemv_mma), outside graph capture, when the budget and RESERVE_BYTES
  of free memory still allow it.

With `q4r` on (PADDOCK_Q4R_MAX_TOKENS > 0) a Q4_K or Q6_K projection also gets its repacked copy for
gemv_q4r (0.625 / 1.25 bytes a weight, taken first: decode steps of many sequences read it, where the
float16 copy serves prefill), charged to the same budget; a fused weight's parts' copies are stacked like
their float16 ones, repacked together into the byte layout where Q4_K parts meet a Q6_K one.
"""

from __future__ import annotations

import logging
from typing import Any

from app.engine.backend.cuda.expand import expand_rows
from app.engine.backend.cuda.weights import CudaFusedWeight, CudaWeight
from app.engine.config import DENSE_CACHE_FRACTION as DENSE_FRACTION
from app.engine.kernels import gemv_q4r

log = logging.getLogger(__name__)

MODES = ("auto", "on", "off")  # "auto": copies within DENSE_FRACTION of the free memory at start
_COLD_SUFFIXES = ("token_embd.weight",)  # read one row per token, never multiplied (unless tied)
RESERVE_BYTES = 1 << 30  # a late copy (promote) must leave this much free: the KV cache is sized by then


class DenseCache:
    def __init__(self, mode: str, free_bytes: int, fraction: float = DENSE_FRACTION, q4r: bool = False) -> None:
        if mode not in MODES:
            raise ValueError(f"dense_cache must be one of {MODES}, not {mode!r}")
        self.mode = mode
        self.q4r = q4r
        self.q4r_bytes = self.q4r_count = 0
        self.budget = 0 if mode == "off" else (None if mode == "on" else int(fraction * free_bytes))
        self.cached_bytes = self.cached_count = 0
        self.skipped_bytes = self.skipped_count = 0

    def _fits(self, size: int) -> bool:
        return self.budget is None or self.cached_bytes + size <= self.budget

    def consider(self, weight: CudaWeight) -> CudaWeight:
        """Give `weight` its float16 copy at load if the policy wants one and memory allows."""
        if self.mode == "off" or weight.data is None:
            return weight
        size = 2 * weight.n_rows * weight.n_cols
        cold = self.mode == "auto" and weight.name.endswith(_COLD_SUFFIXES)
        if self.q4r and not cold:
            self._pack(weight)
        if cold or not self._fits(size) or not self._copy(weight):
            self.skipped_bytes += size
            self.skipped_count += 1
        return weight

    def promote(self, weight: CudaWeight) -> None:
        """A matrix about to be expanded for a product because it has no copy (a tied output head):
        try once to cache it now, if "auto" allows, memory remains and no graph is being
        captured (an allocation there would break the capture)."""
        import cupy

        if weight.cache_checked or self.mode != "auto" or weight.dense16 is not None or weight.data is None:
            return
        try:
            capturing = cupy.cuda.get_current_stream().is_capturing()
        except Exception:  # the query itself is illegal while another stream captures: assume so
            capturing = True
        if capturing:
            return  # asked again on the next call outside the capture
        weight.cache_checked = True
        size = 2 * weight.n_rows * weight.n_cols
        free = cupy.cuda.runtime.memGetInfo()[0] + cupy.get_default_memory_pool().free_bytes()
        if not self._fits(size) or free < size + RESERVE_BYTES or not self._copy(weight):
            return
        self.skipped_bytes -= size
        self.skipped_count -= 1
        log.info("float16 copy of %s made on first use (%.2f GiB)", weight.name, size / 2**30)

    def _copy(self, weight: CudaWeight) -> bool:
        import cupy

        try:
            copy = cupy.empty((weight.n_rows, weight.n_cols), cupy.float16)
        except cupy.cuda.memory.OutOfMemoryError:
            if self.mode == "on":
                raise
            return False
        expand_rows(weight, copy)
        weight.dense16 = copy
        self.cached_bytes += copy.nbytes
        self.cached_count += 1
        return True

    def _pack(self, weight: CudaWeight) -> None:
        """The weight's repacked copy, where its format and shape allow and the budget holds it."""
        import cupy

        if weight.split or not gemv_q4r.packs(weight.qtype.name, weight.n_rows, weight.n_cols):
            return
        if not self._fits(gemv_q4r.packed_bytes([weight.qtype.name], weight.n_rows, weight.n_cols)):
            return
        try:
            weight.q4r = gemv_q4r.pack([_q4r_part(weight)], weight.n_cols)
        except cupy.cuda.memory.OutOfMemoryError:
            if self.mode == "on":
                raise
            return
        self.cached_bytes += weight.q4r.nbytes
        self.q4r_bytes += weight.q4r.nbytes
        self.q4r_count += 1

    def stack(self, fused: CudaFusedWeight) -> CudaFusedWeight:
        """One float16 matrix for a fused weight whose parts all have copies (no extra memory
        once the parts' own copies are released: they become views of the stack); the same for
        their repacked copies (a pair of one shape interleaved instead, see below)."""
        import cupy

        if all(p.q4r is not None for p in fused.parts):
            self._stack_q4r(fused)
        if not all(p.dense16 is not None for p in fused.parts):
            return fused
        fused.dense16 = cupy.concatenate([p.dense16 for p in fused.parts], axis=0)
        for part, start in zip(fused.parts, fused.offsets, strict=True):
            part.dense16 = fused.dense16[start : start + part.n_rows]
        return fused

    def _stack_q4r(self, fused: CudaFusedWeight) -> None:
        import cupy

        parts = fused.parts
        if len(parts) == 2 and len({(p.shape, p.q4r.layout) for p in parts}) == 1:
            # a (gate, up)-like pair: tiles alternating, so the product can apply the activation itself;
            # its parts keep no copy of their own (no slice of the pair is one of them)
            fused.q4r = gemv_q4r.interleave(parts[0].q4r, parts[1].q4r)
            for part in parts:
                part.q4r = None
            return
        if len({p.q4r.layout for p in parts}) == 1:
            fused.q4r = gemv_q4r.stack([p.q4r for p in parts])
        else:  # Q4_K parts beside a Q6_K one: all of them in the byte layout, one launch
            own = sum(p.q4r.nbytes for p in parts)
            try:
                fused.q4r = gemv_q4r.pack([_q4r_part(p) for p in parts], fused.n_cols)
            except cupy.cuda.memory.OutOfMemoryError:
                if self.mode == "on":
                    raise
                return  # the parts keep their own copies (a launch each)
            # the byte layout is larger than the Q4_K parts' own copies, which it replaces
            self.cached_bytes += fused.q4r.nbytes - own
            self.q4r_bytes += fused.q4r.nbytes - own
        for part, view in zip(parts, gemv_q4r.split(fused.q4r, [p.n_rows for p in parts]), strict=True):
            part.q4r = view

    def summary(self) -> str:
        line = f"float16 weight cache ({self.mode}): {self.cached_count} matrices, {self.cached_bytes / 2**30:.2f} GiB"
        if self.skipped_count:
            line += (
                f"; {self.skipped_count} matrices ({self.skipped_bytes / 2**30:.2f} GiB as float16) not cached, "
                "their products above 8 tokens dequantize per call"
            )
        if self.q4r_count:
            line += f"; {self.q4r_count} matrices repacked for gemv_q4r ({self.q4r_bytes / 2**30:.2f} GiB of it)"
        if self.budget is not None and self.mode == "auto":
            line += f" (budget {self.budget / 2**30:.2f} GiB)"
        return line

    def describe(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "cached_matrices": self.cached_count,
            "cached_gib": self.cached_bytes / 2**30,
            "skipped_matrices": self.skipped_count,
            "q4r_matrices": self.q4r_count,
        }


def _q4r_part(weight: CudaWeight) -> tuple[Any, str, int, int]:
    return (weight.data, weight.qtype.name, weight.row_bytes, weight.n_rows)
