"""Write .safetensors files with any stored dtype (F8_E4M3 and U8 included), tensor by tensor.

The `safetensors` package's numpy API has no float8 or bfloat16; the benchmarks' random FP8 /
MXFP4 checkpoints and the loader tests need both. Tensors are given as raw little-endian bytes
(any numpy array, written as its bytes) or as a callable making them, so a checkpoint of many
GiB is written one tensor at a time without holding it in memory.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.engine.loader.split_tensors import ITEM_BYTES


@dataclass(frozen=True)
class StoredTensor:
    dtype: str  # safetensors dtype name: F32, F16, BF16, F8_E4M3, U8
    shape: tuple[int, ...]
    data: np.ndarray | Callable[[], np.ndarray]  # its bytes (any dtype, C order), or a maker of them

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * ITEM_BYTES[self.dtype]


def write_safetensors(
    path: Path, tensors: dict[str, StoredTensor], metadata: dict[str, str] | None = None
) -> None:
    header: dict[str, object] = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for name, tensor in tensors.items():
        header[name] = {
            "dtype": tensor.dtype,
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + tensor.nbytes],
        }
        offset += tensor.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the format pads the header to 8 bytes
    with path.open("wb") as out:
        out.write(struct.pack("<Q", len(encoded)))
        out.write(encoded)
        for name, tensor in tensors.items():
            data = tensor.data() if callable(tensor.data) else tensor.data
            raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
            if raw.nbytes != tensor.nbytes:
                raise ValueError(
                    f"tensor {name!r}: {raw.nbytes} bytes given for {tensor.dtype} {list(tensor.shape)}"
                )
            out.write(memoryview(raw))
