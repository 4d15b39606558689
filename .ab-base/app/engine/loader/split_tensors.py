"""Quantized safetensors weights: codes and their scale tensors joined into one `QuantizedTensor`.

Checkpoints store a quantized matrix as several tensors, recognised per tensor by name and dtype
(one file may mix them with plain BF16/F16/F32 tensors):

- FP8 (`F8_E4M3` weight): `weight_scale_inv` (Hugging Face / DeepSeek fine-grained FP8, blocks of
  `quantization_config.weight_block_size`, 128 x 128) or `weight_scale` (compressed-tensors and
  ModelOpt FP8: one scale per tensor, per output channel or per block), F32 or BF16;
- NVFP4 (`U8` weight of packed e2m1 pairs): `weight_scale` (F8_E4M3, one per 16 weights) and a
  float32 global scale, ModelOpt's `weight_scale_2` (multiplied) or compressed-tensors'
  `weight_global_scale` on a `weight_packed` tensor (divided by);
- MXFP4 (GPT-OSS): `<name>_blocks` (U8, `[..., rows, cols / 32, 16]`) and `<name>_scales` (U8
  e8m0, `[..., rows, cols / 32]`), joined under `<name>`.

Activation and KV-cache scales (`input_scale`, `k_scale`, ...) are dropped: the engine keeps
activations in float. The codes and scales stay the file's bytes (zero-copy views of the map).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.engine.loader.names import CheckpointError
from app.engine.quant.dispatch import QuantizedTensor, ScaleGrid
from app.engine.quant.types import QUANT_TYPES

ITEM_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "U8": 1}  # the dtypes the loader reads
_FLOAT = ("F32", "F16", "BF16")
_SCALE_VIEW = {"F32": "<f4", "BF16": "<u2", "F8_E4M3": "u1", "U8": "u1"}
_COMPANIONS = (".weight_scale_inv", ".weight_scale_2", ".weight_global_scale", ".weight_scale")
_DROPPED = (".input_scale", ".input_global_scale", ".k_scale", ".v_scale", ".q_scale")
DEFAULT_FP8_BLOCK = (128, 128)


@dataclass(frozen=True)
class RawTensor:
    """One safetensors entry: its dtype, shape and bytes (a flat uint8 view of the file)."""

    path: Path
    name: str
    dtype: str
    shape: tuple[int, ...]
    data: np.ndarray

    @property
    def what(self) -> str:
        return f"{self.path}: tensor {self.name!r} ({self.dtype}, shape {list(self.shape)})"

    def rows(self) -> np.ndarray:
        """The bytes as `(leading dims flattened, last dim bytes)`."""
        return self.data.reshape(math.prod(self.shape[:-1]), -1)

    def scalar(self) -> float:
        if self.dtype != "F32" or math.prod(self.shape) != 1:
            raise CheckpointError(f"{self.what}: expected one F32 value")
        return float(self.data.view("<f4")[0])


def stored_format(name: str, dtype: str) -> tuple[str, int] | None:
    """The format a safetensors entry holds weights in and the weights per stored element, from its
    name and dtype alone; None for a scale tensor (part of its weight) or a dropped one. The
    Studio's folder listing reads a checkpoint's mix through this, from the headers."""
    if name.endswith(_DROPPED) or (name.endswith(_COMPANIONS) or name.endswith("_scales")):
        return None
    if dtype == "U8":
        return ("MXFP4_SPLIT", 2) if name.endswith("_blocks") else ("NVFP4_SPLIT", 2)
    return (QUANT_TYPES["FP8_E4M3"].name, 1) if dtype == "F8_E4M3" else (dtype, 1)


def join_tensors(raw: dict[str, RawTensor], fp8_block: tuple[int, int] | None) -> dict[str, QuantizedTensor]:
    """Every tensor the engine uses, under its HF name; companions folded into their weights."""
    out: dict[str, QuantizedTensor] = {}
    consumed: set[str] = set()
    for name, t in raw.items():
        stored = stored_format(name, t.dtype)
        if stored is None:
            continue  # a scale, joined with its weight (checked below), or an activation scale
        if stored[0] == "MXFP4_SPLIT":
            base = name.removesuffix("_blocks")
            out[base] = _mxfp4(t, _companion(raw, t, base + "_scales"), base)
            consumed.add(base + "_scales")
        elif t.dtype == "F8_E4M3":
            scale_name = next(
                (name + s for s in ("_scale_inv", "_scale") if name + s in raw), name + "_scale_inv"
            )
            out[name] = _fp8(t, _companion(raw, t, scale_name), fp8_block or DEFAULT_FP8_BLOCK)
            consumed.add(scale_name)
        elif t.dtype == "U8":
            joined, used = _nvfp4(t, raw)
            out[joined.name] = joined
            consumed.update(used)
        elif t.dtype in _FLOAT:
            out[name] = QuantizedTensor(name, QUANT_TYPES[t.dtype], t.shape, t.rows())
        else:  # pragma: no cover - the reader admits only ITEM_BYTES' dtypes
            raise CheckpointError(f"{t.what}: dtype not loadable")
    for name, t in raw.items():
        if (name.endswith(_COMPANIONS) or name.endswith("_scales")) and name not in consumed:
            raise CheckpointError(f"{t.what}: a scale tensor with no quantized weight beside it")
    return out


def _companion(raw: dict[str, RawTensor], weight: RawTensor, name: str) -> RawTensor:
    if name not in raw:
        raise CheckpointError(f"{weight.what}: quantized, but the checkpoint has no {name!r} with its scales")
    return raw[name]


def _grid_raw(scale: RawTensor, allowed: tuple[str, ...]) -> np.ndarray:
    if scale.dtype not in allowed:
        raise CheckpointError(f"{scale.what}: scales must be {' or '.join(allowed)}")
    return scale.data.view(_SCALE_VIEW[scale.dtype])


def _fp8(weight: RawTensor, scale: RawTensor, block: tuple[int, int]) -> QuantizedTensor:
    if len(weight.shape) != 2:
        raise CheckpointError(f"{weight.what}: an FP8 weight must be a matrix")
    rows, cols = weight.shape
    values = _grid_raw(scale, ("F32", "BF16"))
    n = values.size
    if n == 1:
        grid_raw, group = values.reshape(1, 1), (rows, cols)  # one scale for the tensor
    elif scale.shape in ((rows,), (rows, 1)):
        grid_raw, group = values.reshape(rows, 1), (1, cols)  # one per output channel
    elif len(scale.shape) == 2:
        grid_raw, group = values.reshape(scale.shape), _block_group(rows, cols, scale.shape, block)
    else:
        raise CheckpointError(f"{scale.what}: not a per-tensor, per-channel or block scale of {weight.what}")
    return _split(weight, "FP8_E4M3", weight.shape, weight.rows(), ScaleGrid(grid_raw, scale.dtype, group))


def _block_group(rows: int, cols: int, shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, int]:
    """The block size of a 2-D scale grid: the config's (128 x 128 by default) when it fits, else exact division."""
    sr, sc = shape
    if (-(-rows // block[0]), -(-cols // block[1])) == (sr, sc):
        return block
    return (rows // sr if rows % sr == 0 else rows, cols // sc if cols % sc == 0 else cols)


def _nvfp4(weight: RawTensor, raw: dict[str, RawTensor]) -> tuple[QuantizedTensor, list[str]]:
    stem = weight.name.removesuffix("_packed")  # compressed-tensors names the codes weight_packed
    scale = raw.get(stem + "_scale")
    if scale is None or scale.dtype != "F8_E4M3":
        raise CheckpointError(
            f"{weight.what}: a U8 tensor is read as packed NVFP4 codes, which need an F8_E4M3 "
            f"{stem + '_scale'!r} beside them (or `_blocks` / `_scales` for MXFP4)"
        )
    if stem + "_scale_2" in raw:  # ModelOpt: w = code * scale * weight_scale_2
        global_name, global_scale = stem + "_scale_2", raw[stem + "_scale_2"].scalar()
    elif stem + "_global_scale" in raw:  # compressed-tensors: w = code * scale / weight_global_scale
        global_name, global_scale = stem + "_global_scale", 1.0 / raw[stem + "_global_scale"].scalar()
    else:
        raise CheckpointError(f"{weight.what}: NVFP4 codes without weight_scale_2 or weight_global_scale")
    shape = (*weight.shape[:-1], weight.shape[-1] * 2)
    grid = ScaleGrid(scale.rows().view(np.uint8), "F8_E4M3", (1, 16), global_scale)
    return _split(weight, "NVFP4_SPLIT", shape, weight.rows(), grid, name=stem), [
        stem + "_scale",
        global_name,
    ]


def _mxfp4(blocks: RawTensor, scales: RawTensor, name: str) -> QuantizedTensor:
    *lead, groups, width = blocks.shape if len(blocks.shape) >= 3 else (0, 0, 0)
    if width != 16 or tuple(scales.shape) != (*lead, groups) or scales.dtype != "U8":
        raise CheckpointError(
            f"{blocks.what}: MXFP4 blocks must be [..., rows, cols / 32, 16] with U8 scales [..., rows, cols / 32]; "
            f"the scales are {scales.dtype} {list(scales.shape)}"
        )
    rows = math.prod(lead)
    grid = ScaleGrid(scales.data.reshape(rows, groups), "E8M0", (1, 32))
    return _split(
        blocks, "MXFP4_SPLIT", (*lead, groups * 32), blocks.data.reshape(rows, groups * 16), grid, name
    )


def _split(
    source: RawTensor,
    qtype: str,
    shape: tuple[int, ...],
    data: np.ndarray,
    grid: ScaleGrid,
    name: str | None = None,
) -> QuantizedTensor:
    try:
        return QuantizedTensor(name or source.name, QUANT_TYPES[qtype], shape, data, grid)
    except ValueError as exc:
        raise CheckpointError(f"{source.path}: {exc}") from None
