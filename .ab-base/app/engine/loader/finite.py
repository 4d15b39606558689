"""Refuse weights whose scales are NaN or infinite before the model runs on them.

A NaN block scale makes every logit NaN (empty output, exit 0); checking each value would read
the whole file through float conversion. Block formats keep one or two float16 scales per block:
only those are read, as strided views of the memory map (2 of every 144 bytes for Q4_K), and
float tensors are checked whole. numpy does it chunk by chunk, so the extra memory stays small.
"""

from __future__ import annotations

import numpy as np

from app.engine.loader.names import CheckpointError
from app.engine.quant.dispatch import QuantizedTensor, ScaleGrid

# Per format: the byte offset of each float16 scale in a block (d, then dmin/m where there is one);
# float formats: their one value per "block". Layouts as in quant/types.py and ggml.
SCALE_FIELDS: dict[str, tuple[int, ...]] = {
    "F32": (0,),
    "F16": (0,),
    "BF16": (0,),
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (128 + 64 + 16,),  # after ql, qh and the int8 sub-block scales
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
    "MXFP4": (),  # an e8m0 exponent byte: every value is a finite power of two to ggml
    "NVFP4": (),  # ue4m3 scale bytes: ggml decodes every one to a finite value (0x7F to 0)
}
_FIELD_DTYPE = {"F32": np.dtype("<f4"), "BF16": np.dtype("<u2")}  # others: float16
_BF16_EXPONENT = 0x7F80  # all exponent bits set: inf or NaN
_CHUNK_BLOCKS = 1 << 20  # blocks per numpy pass: a few MiB of temporaries at most


def check_finite(tensors: dict[str, QuantizedTensor], source: object) -> None:
    """Raise CheckpointError naming the first tensor with a NaN or infinite scale (or value)."""
    for name, tensor in tensors.items():
        block = _first_non_finite_block(tensor)
        if block is not None:
            kind = "value" if tensor.qtype.is_float else "block scale"
            raise CheckpointError(
                f"{source}: tensor {name!r} ({tensor.qtype.name}) has a NaN or infinite {kind} "
                f"(block {block}): the file is corrupt"
            )


def _first_non_finite_block(tensor: QuantizedTensor) -> int | None:
    if tensor.scales is not None:
        return _first_non_finite_scale(tensor.scales)
    qtype = tensor.qtype
    dtype = _FIELD_DTYPE.get(qtype.name, np.dtype("<f2"))
    blocks = tensor.data.reshape(-1, qtype.type_size)
    for start in range(0, len(blocks), _CHUNK_BLOCKS):
        chunk = blocks[start : start + _CHUNK_BLOCKS]
        for offset in SCALE_FIELDS[qtype.name]:
            values = chunk[:, offset : offset + dtype.itemsize].view(dtype)[:, 0]
            bad = (values & _BF16_EXPONENT) == _BF16_EXPONENT if dtype.kind == "u" else ~np.isfinite(values)
            if bad.any():
                return start + int(np.argmax(bad))
    return None


def _first_non_finite_scale(grid: ScaleGrid) -> int | None:
    """Index (row-major) of a split tensor's first NaN or infinite scale, read in its stored form."""
    if not np.isfinite(grid.global_scale):
        return 0
    raw = grid.raw.reshape(-1)
    for start in range(0, len(raw), _CHUNK_BLOCKS):
        chunk = raw[start : start + _CHUNK_BLOCKS]
        if grid.dtype == "F32":
            bad = ~np.isfinite(chunk)
        elif grid.dtype == "BF16":
            bad = (chunk & _BF16_EXPONENT) == _BF16_EXPONENT
        elif grid.dtype == "F8_E4M3":
            bad = (chunk & 0x7F) == 0x7F  # e4m3fn's only non-finite codes
        else:  # E8M0: 0xFF is NaN
            bad = chunk == 0xFF
        if bad.any():
            return start + int(np.argmax(bad))
    return None
