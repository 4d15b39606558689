"""Read a Hugging Face model folder's safetensors weights as GGUF-named float tensors.

A folder holds `model.safetensors`, or shards listed by `model.safetensors.index.json`.
Each file is memory-mapped and its tensors are zero-copy uint8 views in `QuantizedTensor`
layout: F32, F16 or BF16, or quantized codes joined with their scale tensors (FP8, NVFP4,
MXFP4: split_tensors.py). The header is parsed here (8-byte length, then JSON) instead of
through the `safetensors` package because its numpy API cannot hand out bfloat16, the
usual dtype of these checkpoints.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from app.engine.loader.names import CheckpointError, gguf_name
from app.engine.loader.split_tensors import ITEM_BYTES, RawTensor, join_tensors
from app.engine.quant.dispatch import QuantizedTensor

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_MAX_HEADER_BYTES = 100_000_000  # the format's own limit; a larger length means a corrupt file
_MAX_DIMS = 8  # no real weight has more; a longer shape is a corrupt header
# BatchNorm's training-step counter (an int64 scalar, Granite Speech's conformer saves one per layer): read by
# no forward pass, so it is left out rather than refused for its dtype.
_UNUSED_SUFFIX = ".num_batches_tracked"


def weight_files(folder: Path) -> list[Path]:
    """The folder's safetensors files: the index's shards, else model.safetensors, else any *.safetensors."""
    index = folder / INDEX_FILE
    if index.is_file():
        weight_map = _read_index(index)
        return [folder / shard for shard in dict.fromkeys(weight_map.values())]
    if (folder / SINGLE_FILE).is_file():
        return [folder / SINGLE_FILE]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder}: no {SINGLE_FILE}, {INDEX_FILE} or other *.safetensors file")
    return files


def read_safetensors_folder(
    folder: str | Path, architecture: str, quantization_config: dict[str, Any] | None = None
) -> dict[str, QuantizedTensor]:
    """All tensors of the folder under their GGUF names (see `names.py`); skipped tensors left out.

    `quantization_config` (config.json's) gives FP8's `weight_block_size`; the format of each
    tensor is read from the tensors themselves."""
    folder = Path(folder)
    raw: dict[str, RawTensor] = {}
    for file in weight_files(folder):
        for name, tensor in read_raw_tensors(file).items():
            if name in raw:
                raise CheckpointError(f"{file}: tensor {name!r} is also in {raw[name].path}")
            raw[name] = tensor
    if (folder / INDEX_FILE).is_file():
        _check_index_matches(folder, raw)
    joined = join_tensors(raw, _fp8_block(folder, quantization_config))
    tensors: dict[str, QuantizedTensor] = {}
    for hf_name, tensor in joined.items():
        file = raw[hf_name].path if hf_name in raw else folder
        try:
            name = gguf_name(hf_name, architecture)
        except CheckpointError as exc:
            raise CheckpointError(f"{file}: {exc}") from None
        if name is None:
            continue
        if name in tensors:
            raise CheckpointError(
                f"{file}: tensor {hf_name!r} maps to {name!r}, which another tensor already has"
            )
        tensors[name] = QuantizedTensor(name, tensor.qtype, tensor.shape, tensor.data, tensor.scales)
    return tensors


def _fp8_block(folder: Path, config: dict[str, Any] | None) -> tuple[int, int] | None:
    block = (config or {}).get("weight_block_size")
    if block is None:
        return None
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise CheckpointError(
            f"{folder}/config.json: quantization_config.weight_block_size {block!r} is not [rows, cols]"
        )
    return (block[0], block[1])


def read_safetensors_file(path: Path) -> dict[str, QuantizedTensor]:
    """Tensors of one .safetensors file under their own (HF) names, as views of the memory-mapped file."""
    return join_tensors(read_raw_tensors(path), None)


def read_raw_tensors(path: Path) -> dict[str, RawTensor]:
    """Entries of one .safetensors file as stored (dtype, shape, bytes), views of the memory-mapped file."""
    if not path.is_file():
        raise CheckpointError(f"{path}: no such safetensors file")
    with path.open("rb") as file:
        size = path.stat().st_size
        if size < 8:
            raise CheckpointError(f"{path}: file is truncated ({size} bytes)")
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    buffer = np.frombuffer(mapped, dtype=np.uint8)
    header, data_start = _read_header(path, mapped)
    tensors = {}
    for name, entry in header.items():
        if name != "__metadata__" and not is_unused_tensor(name):
            tensors[name] = _tensor(path, name, entry, buffer, data_start)
    return tensors


def is_unused_tensor(name: str) -> bool:
    """A tensor no forward pass reads, left out of what the loader returns (and of the Studio's counts)."""
    return name.endswith(_UNUSED_SUFFIX)


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """One .safetensors file's header (name -> {dtype, shape, data_offsets}, and `__metadata__` if any) and
    the offset its data starts at, read without mapping the weights: for the Studio's listing and checks."""
    with path.open("rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size < 8:
            raise CheckpointError(f"{path}: file is truncated ({size} bytes)")
        (length,) = struct.unpack("<Q", file.read(8))
        _check_header_length(path, length, size)
        return _parse_header(path, file.read(length)), 8 + length


def _read_header(path: Path, mapped: mmap.mmap) -> tuple[dict[str, Any], int]:
    (length,) = struct.unpack_from("<Q", mapped, 0)
    _check_header_length(path, length, len(mapped))
    return _parse_header(path, bytes(mapped[8 : 8 + length])), 8 + length


def _check_header_length(path: Path, length: int, size: int) -> None:
    if length > _MAX_HEADER_BYTES or 8 + length > size:
        raise CheckpointError(f"{path}: header length {length} does not fit the {size}-byte file")


def _parse_header(path: Path, raw: bytes) -> dict[str, Any]:
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: header is not valid JSON: {exc}") from None
    except RecursionError:
        raise CheckpointError(f"{path}: header JSON is nested too deep to be a safetensors header") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header is not a JSON object")
    return header


def _tensor(path: Path, name: str, entry: Any, buffer: np.ndarray, data_start: int) -> RawTensor:
    try:
        dtype, shape = entry["dtype"], tuple(_whole(d) for d in entry["shape"])
        begin, end = (_whole(offset) for offset in entry["data_offsets"])
        if not isinstance(dtype, str) or len(shape) > _MAX_DIMS:
            raise ValueError("dtype is not a string, or too many dimensions")
    except (TypeError, KeyError, ValueError):
        raise CheckpointError(
            f"{path}: tensor {name!r} has a malformed header entry {str(entry)[:200]}"
        ) from None
    if dtype not in ITEM_BYTES:
        raise CheckpointError(
            f"{path}: tensor {name!r} has dtype {dtype}, which this engine does not load. "
            f"Supported: {', '.join(ITEM_BYTES)}"
        )
    shape = shape or (1,)  # a scalar is stored as one value
    if 0 in shape:
        raise CheckpointError(f"{path}: tensor {name!r} has an empty dimension in shape {list(shape)}")
    expected = math.prod(shape) * ITEM_BYTES[dtype]  # Python ints: a huge shape cannot overflow to a fit
    if not 0 <= begin <= end or end - begin != expected or data_start + end > len(buffer):
        raise CheckpointError(
            f"{path}: tensor {name!r} ({dtype}, shape {list(shape)}) has data offsets [{begin}, {end}] "
            f"that do not hold {expected} bytes inside the file (truncated or corrupt)"
        )
    return RawTensor(path, name, dtype, shape, buffer[data_start + begin : data_start + end])


def _whole(value: Any) -> int:
    """A non-negative JSON integer (a shape dimension or a data offset); ValueError otherwise."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{value!r} is not a non-negative integer")
    return value


def _read_index(index: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{index}: not a safetensors index with a weight_map ({exc})") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index}: weight_map must map tensor names to shard file names")
    return weight_map


def _check_index_matches(folder: Path, raw: dict[str, RawTensor]) -> None:
    index = folder / INDEX_FILE
    for name, shard in _read_index(index).items():
        found = raw.get(name)
        if found is None or found.path.name != shard:
            raise CheckpointError(f"{index}: lists tensor {name!r} in {shard}, which does not contain it")
