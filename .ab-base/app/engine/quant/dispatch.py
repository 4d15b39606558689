"""A checkpoint tensor in its file's layout, and the per-format routing of work on it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.engine.quant.types import QuantType


@dataclass(frozen=True)
class ScaleGrid:
    """The scales of a split-format tensor, as stored in its checkpoint (see quant/split.py).

    `raw` is `(scale_rows, scale_cols)` in the file's dtype (`dtype`: float32 for "F32",
    uint16 bits for "BF16", uint8 codes for "F8_E4M3" and "E8M0"); scale `[i, j]` covers rows
    `i * group[0] ..` and columns `j * group[1] ..`. `global_scale` multiplies every scale
    (NVFP4's `weight_scale_2`; 1 elsewhere).
    """

    raw: np.ndarray
    dtype: str
    group: tuple[int, int]
    global_scale: float = 1.0

    def check(self, name: str, rows: int, cols: int) -> None:
        """ValueError naming the tensor unless the grid covers a `(rows, cols)` matrix exactly."""
        gr, gc = self.group
        expected = (-(-rows // gr), -(-cols // gc))
        if self.raw.ndim != 2 or self.raw.shape != expected or gr < 1 or gc < 1:
            raise ValueError(
                f"tensor {name!r}: scales of shape {self.raw.shape} do not cover its {rows} x {cols} weights "
                f"in groups of {gr} x {gc} (expected {expected})"
            )

    def values(self) -> np.ndarray:
        from app.engine.quant.split import scale_values

        return scale_values(self.raw, self.dtype)


@dataclass(frozen=True)
class QuantizedTensor:
    """One tensor exactly as stored: raw bytes plus the format that explains them.

    `shape` is the logical shape in numpy order (a matrix is `(out_features,
    in_features)`; GGUF lists dimensions the other way round). `data` is a uint8 view
    `(rows, row_bytes)` over the file (memory-mapped where the loader could), where
    rows are all leading dimensions flattened. Float formats use the same layout. A split
    format (`qtype.split`) holds only the element codes in `data`; its `scales` come beside.
    """

    name: str
    qtype: QuantType
    shape: tuple[int, ...]
    data: np.ndarray
    scales: ScaleGrid | None = None

    def __post_init__(self) -> None:
        rows = int(np.prod(self.shape[:-1], dtype=np.int64)) if len(self.shape) > 1 else 1
        expected = (rows, self.qtype.row_bytes(self.shape[-1]))
        if self.data.dtype != np.uint8 or self.data.shape != expected:
            raise ValueError(
                f"tensor {self.name!r} ({self.qtype.name}, shape {self.shape}): expected uint8 data "
                f"of shape {expected}, got {self.data.dtype} {self.data.shape}"
            )
        if self.qtype.split != (self.scales is not None):
            raise ValueError(
                f"tensor {self.name!r}: {self.qtype.name} {'needs' if self.qtype.split else 'takes no'} scales"
            )
        if self.scales is not None:
            self.scales.check(self.name, rows, self.shape[-1])

    @property
    def n_rows(self) -> int:
        return int(self.data.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes) + (int(self.scales.raw.nbytes) if self.scales is not None else 0)

    def dequantize(self, rows: np.ndarray | slice | None = None) -> np.ndarray:
        """float32 values of the whole tensor, or of the selected rows (matrices only)."""
        from app.engine.quant.reference import dequantize

        if self.scales is not None:
            return self._dequantize_split(rows)
        if rows is None:
            return dequantize(self.data, self.qtype).reshape(self.shape)
        return dequantize(self.data[rows], self.qtype)

    def _dequantize_split(self, rows: np.ndarray | slice | None) -> np.ndarray:
        from app.engine.quant.split import dequantize_split

        assert self.scales is not None
        index = np.arange(self.n_rows)[rows if rows is not None else slice(None)]
        grid = self.scales
        values = dequantize_split(
            self.data[index], self.qtype, grid.values(), grid.group, grid.global_scale, index
        )
        return values.reshape(self.shape) if rows is None else values

    @classmethod
    def from_float(cls, name: str, values: np.ndarray, qtype: QuantType) -> QuantizedTensor:
        """Wrap a float array as an F32/F16/BF16 tensor (used by the safetensors loader and tests)."""
        from app.engine.quant.reference import encode_float

        values = np.asarray(values)
        shape = tuple(int(d) for d in values.shape) or (1,)
        raw = encode_float(values.reshape(shape), qtype)
        rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
        return cls(name, qtype, shape, raw.reshape(rows, -1))
