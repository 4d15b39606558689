"""A checkpoint matrix kept in its file's bytes for the numba kernels, with its compiled kernels."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.engine.backend.cpu_fast import kernels
from app.engine.quant.dispatch import QuantizedTensor

FAST_FORMATS = frozenset(kernels.FORMAT_CODES)  # F32 matrices stay with the numpy backend (rare, small)


@dataclass(frozen=True)
class FormatKernels:
    gemv: Any
    gemm_rows: Any
    dequantize: Any


@functools.cache
def format_kernels(name: str) -> FormatKernels:
    """One format's kernels; each compiles (or loads from numba's disk cache) on its first call."""
    return FormatKernels(kernels.make_gemv(name), kernels.make_gemm_rows(name), kernels.make_dequantize(name))


@functools.cache
def half_table() -> np.ndarray:
    return kernels.half_table()


class FastWeight:
    """A `[out, in]` matrix as its quantized rows: a read-only view of the (memory-mapped) file.

    Read-only on purpose: numba compiles one version per array type, and a writable array (from
    the safetensors loader or a test) would be a second type to compile."""

    def __init__(self, tensor: QuantizedTensor) -> None:
        if len(tensor.shape) != 2 or tensor.qtype.name not in FAST_FORMATS:
            raise ValueError(f"{tensor.name}: the fast CPU kernels take 2-D {sorted(FAST_FORMATS)} matrices")
        self.tensor = tensor
        data = np.ascontiguousarray(tensor.data).view()
        data.flags.writeable = False
        self.data = data
        self.kernels = format_kernels(tensor.qtype.name)

    @property
    def shape(self) -> tuple[int, int]:
        return self.tensor.shape  # type: ignore[return-value]

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """float32 values of rows `ids` (embedding lookups)."""
        out = np.empty((len(ids), self.shape[1]), np.float32)
        self.kernels.dequantize(self.data, half_table(), np.ascontiguousarray(ids, dtype=np.int64), out)
        return out

    def tile(self, start: int, out: np.ndarray) -> np.ndarray:
        """Rows `start : start + len(out)` decoded into `out`."""
        self.kernels.dequantize(self.data, half_table(), np.arange(start, start + len(out), dtype=np.int64), out)
        return out
