"""A checkpoint tensor in its file's layout, and the per-format routing of work on it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.engine.quant.types import QuantType


@dataclass(frozen=True)
class QuantizedTensor:
    """One tensor exactly as stored: raw bytes plus the format that explains them.

    `shape` is the logical shape in numpy order (a matrix is `(out_features,
    in_features)`; GGUF lists dimensions the other way round). `data` is a uint8 view
    `(rows, row_bytes)` over the file (memory-mapped where the loader could), where
    rows are all leading dimensions flattened. Float formats use the same layout.
    """

    name: str
    qtype: QuantType
    shape: tuple[int, ...]
    data: np.ndarray

    def __post_init__(self) -> None:
        rows = int(np.prod(self.shape[:-1], dtype=np.int64)) if len(self.shape) > 1 else 1
        expected = (rows, self.qtype.row_bytes(self.shape[-1]))
        if self.data.dtype != np.uint8 or self.data.shape != expected:
            raise ValueError(
                f"tensor {self.name!r} ({self.qtype.name}, shape {self.shape}): expected uint8 data "
                f"of shape {expected}, got {self.data.dtype} {self.data.shape}"
            )

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def dequantize(self, rows: np.ndarray | slice | None = None) -> np.ndarray:
        """float32 values of the whole tensor, or of the selected rows (matrices only)."""
        from app.engine.quant.reference import dequantize

        if rows is None:
            return dequantize(self.data, self.qtype).reshape(self.shape)
        return dequantize(self.data[rows], self.qtype)

    @classmethod
    def from_float(cls, name: str, values: np.ndarray, qtype: QuantType) -> QuantizedTensor:
        """Wrap a float array as an F32/F16/BF16 tensor (used by the safetensors loader and tests)."""
        from app.engine.quant.reference import encode_float

        values = np.asarray(values)
        shape = tuple(int(d) for d in values.shape) or (1,)
        raw = encode_float(values.reshape(shape), qtype)
        rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
        return cls(name, qtype, shape, raw.reshape(rows, -1))
