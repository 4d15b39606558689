"""Checkpoint tensors on the GPU, still in their file's block layout.

A matrix goes up as one flat uint8 buffer of its rows, padded by 16 bytes: the kernels
read 16-byte words that may run past a row of the 2-byte-aligned formats (see ld16u in
common.cuh). Float matrices whose rows are not a whole number of 32-weight units (the
unit every kernel works in) are kept dense in float32 instead, and served by cuBLAS.
Vectors (norms, biases) become plain float32 arrays.

A split-format matrix (FP8, NVFP4, MXFP4 from safetensors) goes up as two buffers, its codes and
its scale grid, each as the checkpoint stores it, with the `SplitLayout` that reads them.

A matrix may also carry a float16 copy (`dense16`, see dense.py) for products over
more tokens than the GEMV serves; a fused weight (q/k/v, gate/up) groups matrices that
multiply the same input so that one launch serves them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from app.engine.kernels.gemv_split import SplitLayout
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QuantType

PAD_BYTES = 16


class GpuMemoryError(MemoryError):
    """The GPU ran out of memory while taking a tensor: names the tensor and its size."""


@dataclass
class CudaWeight:
    """A `[rows, cols]` matrix on the GPU: quantized blocks, or a dense float32 fallback."""

    name: str
    qtype: QuantType
    shape: tuple[int, int]
    row_bytes: int
    data: Any | None  # uint8 device buffer of rows * row_bytes + PAD_BYTES bytes
    dense: Any | None = None  # float32 device matrix when the kernels cannot read `data`
    dense16: Any | None = None  # float16 copy of the values for T > GEMV_MAX_TOKENS (dense.py)
    cache_checked: bool = False  # a late float16 copy was considered (cuda_dense.DenseCache.promote)
    scales: Any | None = None  # split formats: the scale grid's bytes on the device
    layout: SplitLayout | None = None  # split formats: how to read `data` and `scales`
    q4r: Any | None = None  # Q4_K / Q6_K repacked for gemv_q4r (gemv_q4r.Q4rWeight; dense.py says when)

    @property
    def n_rows(self) -> int:
        return self.shape[0]

    @property
    def n_cols(self) -> int:
        return self.shape[1]

    @property
    def nbytes(self) -> int:
        scales = int(self.scales.nbytes) if self.scales is not None else 0
        return int(self.data.nbytes if self.data is not None else self.dense.nbytes) + scales

    @property
    def split(self) -> bool:
        return self.layout is not None


@dataclass
class CudaFusedWeight:
    """Matrices that multiply the same input, stacked along the output: `[sum rows_i, cols]`.

    Each part keeps its own format; `bias` covers every row (zeros where a part has none)
    or is None when no part has one. When every part has a float16 copy, `dense16` holds
    them stacked (the parts' `dense16` are views of it), so one cuBLAS call serves all."""

    parts: tuple[CudaWeight, ...]
    bias: Any | None = None
    dense16: Any | None = None
    q4r: Any | None = None  # every part's repacked copy, stacked (their `q4r` are views of it)

    @property
    def name(self) -> str:
        return "+".join(p.name for p in self.parts)

    @property
    def n_rows(self) -> int:
        return sum(p.n_rows for p in self.parts)

    @property
    def n_cols(self) -> int:
        return self.parts[0].n_cols

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n_rows, self.n_cols)

    @property
    def offsets(self) -> list[int]:
        """First output column of each part."""
        out, start = [], 0
        for p in self.parts:
            out.append(start)
            start += p.n_rows
        return out


def host_float(tensor: QuantizedTensor) -> np.ndarray | None:
    """float32 values of an F32/F16/BF16 tensor, decoded here (no dequantizer needed)."""
    raw = np.ascontiguousarray(tensor.data)
    if tensor.qtype.name == "F32":
        return raw.view(np.float32).reshape(tensor.shape)
    if tensor.qtype.name == "F16":
        return raw.view(np.float16).astype(np.float32).reshape(tensor.shape)
    if tensor.qtype.name == "BF16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(tensor.shape)
    return None


def _upload(array: np.ndarray, what: str) -> Any:
    import cupy

    try:
        return cupy.asarray(array)
    except cupy.cuda.memory.OutOfMemoryError as exc:
        free, total = cupy.cuda.runtime.memGetInfo()
        raise GpuMemoryError(
            f"out of GPU memory taking {what} ({array.nbytes / 2**20:.1f} MiB; "
            f"{free / 2**20:.0f} MiB free of {total / 2**20:.0f} MiB). The model does not fit on this GPU: "
            "pick a smaller quantization or model, or close other programs using the GPU."
        ) from exc


def upload_matrix(tensor: QuantizedTensor) -> CudaWeight:
    """A 2-D (or higher, flattened to rows) checkpoint tensor onto the GPU."""
    rows = int(np.prod(tensor.shape[:-1], dtype=np.int64))
    cols = int(tensor.shape[-1])
    what = f"tensor {tensor.name!r} ({tensor.qtype.name}, shape {tensor.shape})"
    row_bytes = tensor.qtype.row_bytes(cols)
    if tensor.scales is not None:
        layout = SplitLayout.of(tensor)
        scales = _upload(_padded(np.ascontiguousarray(tensor.scales.raw).view(np.uint8).reshape(-1)), what)
        codes = _upload(_padded(np.ascontiguousarray(tensor.data).reshape(-1)), what)
        return CudaWeight(
            tensor.name, tensor.qtype, (rows, cols), row_bytes, codes, scales=scales, layout=layout
        )
    if cols % 32:
        # Only float formats can have such rows (every block format is a multiple of 32).
        dense = host_float(tensor)
        if dense is None:
            raise ValueError(f"{what}: rows of {cols} weights are not a multiple of 32")
        return CudaWeight(
            tensor.name, tensor.qtype, (rows, cols), row_bytes, None, _upload(dense.reshape(rows, cols), what)
        )
    flat = np.empty(rows * row_bytes + PAD_BYTES, np.uint8)
    flat[: rows * row_bytes] = np.ascontiguousarray(tensor.data).reshape(-1)
    flat[rows * row_bytes :] = 0
    return CudaWeight(tensor.name, tensor.qtype, (rows, cols), row_bytes, _upload(flat, what))


def _padded(raw: np.ndarray) -> np.ndarray:
    flat = np.zeros(raw.nbytes + PAD_BYTES, np.uint8)
    flat[: raw.nbytes] = raw
    return flat


def upload_vector(tensor: QuantizedTensor) -> Any:
    """A 1-D tensor (norm weight, bias) as a float32 device vector."""
    import cupy

    values = host_float(tensor)
    if values is None and tensor.scales is not None:
        values = tensor.dequantize()  # a split-format vector: small, expanded here
    if values is not None:
        return _upload(np.ascontiguousarray(values, np.float32).reshape(-1), f"tensor {tensor.name!r}")
    # A quantized vector: expand it on the GPU as a one-row matrix (its length is whole blocks).
    from app.engine.kernels.dequant import dequant_rows

    weight = upload_matrix(
        QuantizedTensor(tensor.name, tensor.qtype, (1, tensor.shape[0]), tensor.data.reshape(1, -1))
    )
    out = cupy.empty((1, weight.n_cols), cupy.float32)
    dequant_rows(weight.data, tensor.qtype.name, weight.row_bytes, 1, weight.n_cols, out)
    return out.reshape(-1)
