"""The quantization formats the engine understands, described as data.

Each format is one `QuantType`: its GGML id, how many weights one block holds, and how
many bytes that block takes (written as a sum of its parts so the byte layout reads off
the table). The numpy dequantizer of each format lives in `reference.py`; CUDA kernels
register against the same names in `dispatch.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

QK_K = 256  # super-block size of the k-quants


@dataclass(frozen=True)
class QuantType:
    name: str
    ggml_id: int
    block_size: int  # weights per block
    type_size: int  # bytes per block

    def row_bytes(self, n_cols: int) -> int:
        """Bytes of one row of `n_cols` weights; `n_cols` must be a whole number of blocks."""
        if n_cols % self.block_size:
            raise ValueError(f"{self.name}: row of {n_cols} weights is not a multiple of {self.block_size}")
        return n_cols // self.block_size * self.type_size

    @property
    def is_float(self) -> bool:
        return self.block_size == 1


_TABLE = [
    QuantType("F32", 0, 1, 4),
    QuantType("F16", 1, 1, 2),
    QuantType("BF16", 30, 1, 2),
    QuantType("Q4_0", 2, 32, 2 + 16),
    QuantType("Q4_1", 3, 32, 2 + 2 + 16),
    QuantType("Q5_0", 6, 32, 2 + 4 + 16),
    QuantType("Q5_1", 7, 32, 2 + 2 + 4 + 16),
    QuantType("Q8_0", 8, 32, 2 + 32),
    QuantType("Q4_K", 12, QK_K, 2 + 2 + 12 + QK_K // 2),
    QuantType("Q5_K", 13, QK_K, 2 + 2 + 12 + QK_K // 8 + QK_K // 2),
    QuantType("Q6_K", 14, QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2),
]

QUANT_TYPES: dict[str, QuantType] = {q.name: q for q in _TABLE}
_BY_ID: dict[int, QuantType] = {q.ggml_id: q for q in _TABLE}


class UnsupportedQuantType(ValueError):
    """A tensor's format is unknown to the engine (raised at load, naming the tensor)."""


def quant_type(name_or_id: str | int) -> QuantType:
    """Look a format up by name ("Q4_K") or GGML id (12)."""
    table = _BY_ID if isinstance(name_or_id, int) else QUANT_TYPES
    try:
        return table[name_or_id]  # type: ignore[index]
    except KeyError:
        supported = ", ".join(QUANT_TYPES)
        raise UnsupportedQuantType(f"unsupported tensor type {name_or_id!r}. Supported: {supported}") from None
