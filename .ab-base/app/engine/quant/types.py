"""The quantization formats the engine understands, described as data.

Each format is one `QuantType`: its GGML id, how many weights one block holds, and how
many bytes that block takes (written as a sum of its parts so the byte layout reads off
the table). The numpy dequantizer of each format lives in `reference.py` (`lowbit.py` for
MXFP4 and the IQ4 types); CUDA kernels register against the same names in `dispatch.py`.

"Split" formats come from safetensors checkpoints: the tensor holds only the element codes
(one fp8 byte, or two fp4 nibbles, per byte) and its scales live in a second tensor of the
file (`weight_scale_inv`, `weight_scale`, `*_scales`), carried beside it as a `ScaleGrid`
(dispatch.py, decoded by split.py). They have no GGML id.
"""

from __future__ import annotations

from dataclasses import dataclass

QK_K = 256  # super-block size of the k-quants


@dataclass(frozen=True)
class QuantType:
    name: str
    ggml_id: int | None  # None: not a GGUF type (split formats)
    block_size: int  # weights per block
    type_size: int  # bytes per block
    split: bool = False  # codes only; the scales come in a ScaleGrid beside the tensor

    def row_bytes(self, n_cols: int) -> int:
        """Bytes of one row of `n_cols` weights; `n_cols` must be a whole number of blocks."""
        if n_cols % self.block_size:
            raise ValueError(f"{self.name}: row of {n_cols} weights is not a multiple of {self.block_size}")
        return n_cols // self.block_size * self.type_size

    @property
    def is_float(self) -> bool:
        return self.block_size == 1 and not self.split


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
    QuantType("IQ4_NL", 20, 32, 2 + 16),  # d, 16 bytes of nibbles indexing a 16-value table
    QuantType("IQ4_XS", 23, QK_K, 2 + 2 + QK_K // 64 + QK_K // 2),  # d, scales_h, scales_l, nibbles
    QuantType("MXFP4", 39, 32, 1 + 16),  # e8m0 exponent, 16 bytes of e2m1 nibbles
    QuantType("NVFP4", 40, 64, 4 + 32),  # GGUF's NVFP4: 4 ue4m3 scales (one per 16), 32 bytes of e2m1 nibbles
    QuantType("FP8_E4M3", None, 1, 1, split=True),  # one float8_e4m3fn code per byte
    QuantType("NVFP4_SPLIT", None, 2, 1, split=True),  # ModelOpt: e2m1 pairs, e4m3 scale per 16 + global
    QuantType("MXFP4_SPLIT", None, 2, 1, split=True),  # GPT-OSS: e2m1 pairs, e8m0 scale per 32
]

QUANT_TYPES: dict[str, QuantType] = {q.name: q for q in _TABLE}
_BY_ID: dict[int, QuantType] = {q.ggml_id: q for q in _TABLE if q.ggml_id is not None}


class UnsupportedQuantType(ValueError):
    """A tensor's format is unknown to the engine (raised at load, naming the tensor)."""


def quant_type(name_or_id: str | int) -> QuantType:
    """Look a format up by name ("Q4_K") or GGML id (12)."""
    table = _BY_ID if isinstance(name_or_id, int) else QUANT_TYPES
    try:
        return table[name_or_id]  # type: ignore[index]
    except KeyError:
        supported = ", ".join(QUANT_TYPES)
        raise UnsupportedQuantType(
            f"unsupported tensor type {name_or_id!r}. Supported: {supported}"
        ) from None
