"""Forge GGUF files for the corrupt-file tests: a real file's header, edited at will (lying counts,
dimensions, metadata) and written back, its tensor data copied or left as a sparse run of zeros.

Written here, not with gguf-py's GGUFWriter, because the writer refuses the very lies these tests
need (a tensor count that disagrees with the tensors, dimensions that do not match the data).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf import GGUFValueType

from app.engine.loader.gguf import read_gguf

ALIGNMENT = 32
_SCALARS = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q", GGUFValueType.FLOAT32: "<f",
    GGUFValueType.FLOAT64: "<d", GGUFValueType.BOOL: "<?",
}  # fmt: skip


@dataclass(frozen=True)
class Typed:
    """A metadata value with its GGUF type stated (else the type is inferred from the Python value)."""

    type: GGUFValueType
    value: Any


@dataclass
class Tensor:
    name: str
    dims: list[int]  # GGUF order: the fastest-varying dimension first
    type_id: int
    data: bytes | int  # the bytes, or a byte count to leave as zeros (sparse)
    offset: int | None = None  # None: laid out one after another


@dataclass
class Forge:
    metadata: dict[str, Any]
    tensors: list[Tensor]
    version: int = 3
    tensor_count: int | None = None  # None: the true count
    _encoded: dict[str, tuple[Any, bytes]] = field(default_factory=dict, repr=False)  # shared by copies

    @classmethod
    def of(cls, path: Path, *, keep_data: bool = True) -> Forge:
        """Header and tensors of a real file; `keep_data=False` leaves the data as zeros (fast for 250 MB)."""
        file = read_gguf(path)
        tensors = [
            Tensor(
                name, list(reversed(t.shape)), t.qtype.ggml_id, t.data.tobytes() if keep_data else t.nbytes
            )
            for name, t in file.tensors.items()
        ]
        return cls(dict(file.metadata), tensors, file.version)

    def copy(self) -> Forge:
        """An editable copy: its own metadata dict and tensor list, the encoding cache shared."""
        tensors = [Tensor(t.name, list(t.dims), t.type_id, t.data, t.offset) for t in self.tensors]
        return Forge(dict(self.metadata), tensors, self.version, self.tensor_count, self._encoded)

    def tensor(self, name: str) -> Tensor:
        return next(t for t in self.tensors if t.name == name)

    def write(self, path: Path) -> Path:
        header = bytearray(b"GGUF")
        count = len(self.tensors) if self.tensor_count is None else self.tensor_count
        header += struct.pack("<IQQ", self.version, count, len(self.metadata))
        for key, value in self.metadata.items():
            cached = self._encoded.get(key)
            if cached is None or cached[0] is not value:  # encoding a 262k-token vocabulary takes seconds
                cached = self._encoded[key] = (value, _string(key) + _value(value))
            header += cached[1]
        offsets, position = [], 0
        for t in self.tensors:
            offset = position if t.offset is None else t.offset
            offsets.append(offset)
            size = t.data if isinstance(t.data, int) else len(t.data)
            position = _align(max(position, offset + size))
            header += _string(t.name) + struct.pack(f"<I{len(t.dims)}Q", len(t.dims), *t.dims)
            header += struct.pack("<IQ", t.type_id, offset)
        data_start = _align(len(header))
        with path.open("wb") as out:
            out.write(bytes(header) + bytes(data_start - len(header)))
            for t, offset in zip(self.tensors, offsets, strict=True):
                if not isinstance(t.data, int):
                    out.seek(data_start + offset)
                    out.write(t.data)
            out.truncate(data_start + position)  # zeros past the last write stay sparse
        return path


def _align(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def _string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def _type_of(value: Any) -> GGUFValueType:
    if isinstance(value, Typed):
        return value.type
    if isinstance(value, bool):
        return GGUFValueType.BOOL
    if isinstance(value, int):
        return (
            GGUFValueType.INT32
            if value < 0
            else GGUFValueType.UINT32
            if value < 2**32
            else GGUFValueType.UINT64
        )
    if isinstance(value, float):
        return GGUFValueType.FLOAT32
    if isinstance(value, str):
        return GGUFValueType.STRING
    return GGUFValueType.ARRAY


def _value(value: Any) -> bytes:
    kind = _type_of(value)
    return struct.pack("<I", kind) + _payload(kind, value.value if isinstance(value, Typed) else value)


def _payload(kind: GGUFValueType, value: Any) -> bytes:
    if kind == GGUFValueType.STRING:
        return _string(value)
    if kind == GGUFValueType.ARRAY:
        item = _item_type(value)
        return struct.pack("<IQ", item, len(value)) + b"".join(_payload(item, v) for v in value)
    return struct.pack(_SCALARS[kind], value)


def _item_type(values: list[Any]) -> GGUFValueType:
    """One type for all of an array's items: the widest integer type they need, else the first's type."""
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return _type_of(min(values)) if min(values) < 0 else _type_of(max(values))
    return _type_of(values[0]) if values else GGUFValueType.UINT32
