"""Wrapper of gemv_q4r.cu: products of 1..MAX_TOKENS tokens on K-quant weights repacked for the tensor cores.

`pack` turns the rows of one or more weights stacked along the output (q/k/v, gate/up) into a layout the
kernel reads: Q4_K alone into the 4-bit one (0.625 bytes a weight: codes in fragment order, float16 scale
pairs per 32 columns), Q6_K, or Q4_K stacked with Q6_K, into the byte one (1.25 bytes a weight: a code a
byte, pairs per 16 columns); both with a power-of-two factor per row (the .cu file's header says why each
part is there). `gemv_q4r` multiplies x by such a weight: a pre-pass rounds float32 x to float16, then one
launch over row blocks and, where those are too few to fill the GPU, column splits reduced in a fixed order.
Each block streams its chunks of x and of its weight through STAGES shared-memory stages (`shared_bytes`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.engine import envs
from app.engine.kernels.runtime.compile import get_kernel
from app.engine.kernels.runtime.launch import (
    allow_shared,
    cdiv,
    i32,
    i64,
    launch,
    max_shared_bytes,
    ptr,
    resident_blocks,
    sm_count,
)
from app.engine.quant.types import QUANT_TYPES

SOURCE = "gemv_q4r.cu"
FORMATS = ("Q4_K", "Q6_K")
LAYOUT_4BIT, LAYOUT_BYTES = 0, 1
N_TILES = (1, 2, 4, 8, 16)  # builds by tokens: 8 per n-tile
MAX_TOKENS = 8 * N_TILES[-1]
WARPS = 4
CHUNK = 64  # columns a chunk (the unit of the column splits)
MULTIPROCESSORS = 132  # H100 SXM and H200
# Blocks of 4 warps the splits aim for where the device's own count is not asked (no GPU): about three resident
# on each multiprocessor. On the GPU, gemv_q4r asks the occupancy calculator for the build's count.
BLOCKS_TARGET = 3 * MULTIPROCESSORS
STAGES = 4  # chunks a block stages in shared memory (3 in flight), fewer where a device's shared memory is short
# 16-byte units of one 16-row tile's record a chunk (codes, then scale pairs) in each layout: gemv_q4r.cu's
# CODE_UNITS + SCALE_UNITS
RECORD_UNITS = {0: 32 + 32, 1: 64 + 16}
MIN_CHUNKS_PER_SPLIT = 8  # a split's pipeline fill and reduction are paid for by at least 512 columns
MAX_SPLITS = 16
X16_THREADS = 256
PACK_THREADS = 256


@dataclass(frozen=True)
class Q4rWeight:
    """A weight (or weights stacked along the output) in one of the repacked layouts, on the device."""

    codes: Any  # uint32 [n_rows / 16, n_cols / 64, 32, 4] (4-bit); [n_rows / 16, n_cols / 64, 2, 32, 4] (bytes)
    scales: Any  # uint32 [n_rows / 16, n_cols / 256, 32, 4] (4-bit); [n_rows / 16, n_cols / 64, 32, 2] (bytes)
    row_scale: Any  # float32 [n_rows]: 2^-e of each row's scale pairs
    n_rows: int
    n_cols: int
    layout: int = LAYOUT_4BIT
    interleaved: bool = False  # two weights' 16-row tiles alternating (a gate/up pair: `interleave`)

    @property
    def nbytes(self) -> int:
        return int(self.codes.nbytes + self.scales.nbytes + self.row_scale.nbytes)


def packs(qtype_name: str, n_rows: int, n_cols: int) -> bool:
    """Whether a weight of this format and shape can be repacked (whole 16-row tiles, whole 256-weight blocks)."""
    return qtype_name in FORMATS and n_rows % 16 == 0 and n_rows > 0 and n_cols % 256 == 0


def layout_of(qtype_names: Sequence[str]) -> int:
    """The layout of weights of these formats stacked: 4-bit for Q4_K alone, else bytes."""
    return LAYOUT_4BIT if all(q == "Q4_K" for q in qtype_names) else LAYOUT_BYTES


def packed_bytes(qtype_names: Sequence[str], n_rows: int, n_cols: int) -> int:
    """Device bytes of weights of these formats stacked to `n_rows` x `n_cols` once packed: per weight the
    codes (4 bits or a byte) and scale pairs (two float16 per 32 or per 16 columns), per row its factor."""
    per_weight_eighths = 5 if layout_of(qtype_names) == LAYOUT_4BIT else 10
    return n_rows * n_cols * per_weight_eighths // 8 + 4 * n_rows


def pack(parts: Sequence[tuple[Any, str, int, int]], n_cols: int) -> Q4rWeight:
    """The repacked weight of weights `(data, qtype_name, row_bytes, n_rows)` stacked along the output, each
    of FORMATS, a multiple of 16 rows and all `n_cols` wide (a multiple of 256)."""
    import cupy

    for _, qtype, row_bytes, n_rows in parts:
        if not packs(qtype, n_rows, n_cols) or row_bytes != QUANT_TYPES[qtype].row_bytes(n_cols):
            raise ValueError(f"gemv_q4r packs {FORMATS} weights of 16k rows by 256k columns, not {qtype} "
                             f"{n_rows} x {n_cols}")  # fmt: skip
    layout = layout_of([p[1] for p in parts])
    tiles, chunks = sum(p[3] for p in parts) // 16, n_cols // CHUNK
    if layout == LAYOUT_4BIT:
        codes = cupy.empty((tiles, chunks, 32, 4), cupy.uint32)
        scales = cupy.empty((tiles, n_cols // 256, 32, 4), cupy.uint32)
    else:
        codes = cupy.empty((tiles, chunks, 2, 32, 4), cupy.uint32)
        scales = cupy.empty((tiles, chunks, 32, 2), cupy.uint32)
    row_scale = cupy.empty(16 * tiles, cupy.float32)
    offset = 0
    for data, qtype, row_bytes, n_rows in parts:
        head = (data, i64(row_bytes), i32(n_rows), i32(n_cols), i32(offset))
        if layout == LAYOUT_4BIT:
            launch(get_kernel(SOURCE, "q4r_pack"), (n_rows // 16,), (PACK_THREADS,), (*head, codes, scales, row_scale))
        else:
            launch(get_kernel(SOURCE, "q8r_pack"), (n_rows // 16,), (PACK_THREADS,),
                   (*head, i32(qtype == "Q6_K"), codes, scales, row_scale))  # fmt: skip
        offset += n_rows // 16
    return Q4rWeight(codes, scales, row_scale, 16 * tiles, n_cols, layout)


def stack(weights: Sequence[Q4rWeight]) -> Q4rWeight:
    """Packed weights of the same width as one, stacked along the output (a fused weight's parts)."""
    import cupy

    if len({(w.n_cols, w.layout) for w in weights}) != 1:
        raise ValueError("repacked weights stack only at one width and in one layout")
    return Q4rWeight(
        cupy.concatenate([w.codes for w in weights]), cupy.concatenate([w.scales for w in weights]),
        cupy.concatenate([w.row_scale for w in weights]), sum(w.n_rows for w in weights), weights[0].n_cols,
        weights[0].layout,
    )  # fmt: skip


def interleave(first: Q4rWeight, second: Q4rWeight) -> Q4rWeight:
    """Two packed weights of one shape and layout as one whose 16-row tiles alternate between them: a warp
    then holds a gate tile and the up tile of the same rows, and the product's epilogue can apply the
    gated activation itself (`gemv_q4r(..., act=)`); without it the output is still [first | second]."""
    import cupy

    if (first.n_rows, first.n_cols, first.layout) != (second.n_rows, second.n_cols, second.layout):
        raise ValueError("only weights of one shape and layout interleave")
    tiles = first.n_rows // 16
    codes = cupy.stack([first.codes, second.codes], axis=1).reshape(2 * tiles, *first.codes.shape[1:])
    scales = cupy.stack([first.scales, second.scales], axis=1).reshape(2 * tiles, *first.scales.shape[1:])
    row_scale = cupy.stack([first.row_scale.reshape(tiles, 16), second.row_scale.reshape(tiles, 16)], axis=1)
    return Q4rWeight(codes, scales, row_scale.reshape(-1), 2 * first.n_rows, first.n_cols, first.layout, True)


def split(weight: Q4rWeight, rows: Sequence[int]) -> list[Q4rWeight]:
    """Views of a stacked q4r weight's parts of `rows` each (multiples of 16); not of an interleaved one."""
    if weight.interleaved:
        raise ValueError("an interleaved weight's parts are no slices of it")
    views, tile = [], 0
    for n in rows:
        t = n // 16
        views.append(Q4rWeight(weight.codes[tile : tile + t], weight.scales[tile : tile + t],
                               weight.row_scale[16 * tile : 16 * (tile + t)], n, weight.n_cols, weight.layout))  # fmt: skip
        tile += t
    if 16 * tile != weight.n_rows:
        raise ValueError(f"parts of {sum(rows)} rows do not cover a q4r weight of {weight.n_rows}")
    return views


@dataclass(frozen=True)
class Q4rShape:
    m_tiles: int  # 16-row tiles a warp
    n_tiles: int  # 8-token tiles
    splits: int  # blocks sharing a row block's columns (gridDim.y)

    def rows(self) -> int:
        return 16 * self.m_tiles * WARPS


def pick_shape(n_tok: int, n_rows: int, n_cols: int, blocks_target: int = BLOCKS_TARGET) -> Q4rShape:
    """Two 16-row tiles a warp (each staged x fragment serves both: shared-memory reads per product
    halve), n-tiles by tokens, and column splits until the grid holds `blocks_target` blocks (as many as
    the GPU keeps resident at once), each split keeping MIN_CHUNKS_PER_SPLIT chunks."""
    n_tiles = next(n for n in N_TILES if 8 * n >= n_tok)
    shape = Q4rShape(2, n_tiles, 1)
    blocks, chunks = cdiv(n_rows, shape.rows()), n_cols // CHUNK
    splits = 1
    while (blocks * splits < blocks_target and splits < MAX_SPLITS
           and chunks // (2 * splits) >= MIN_CHUNKS_PER_SPLIT):  # fmt: skip
        splits *= 2
    return Q4rShape(2, n_tiles, splits)


def weights_staged() -> bool:
    """Q4R_WSMEM: whether the weight records ride the shared-memory stages (the default) or, in an A/B build
    that $PADDOCK_KERNEL_DEFINES asks for, registers."""
    return int(envs.PADDOCK_KERNEL_DEFINES.get("Q4R_WSMEM", 1)) != 0


def stage_bytes(shape: Q4rShape, layout: int = LAYOUT_4BIT) -> int:
    """gemv_q4r.cu's STAGE_BYTES: a chunk of x for the build's tokens, and each warp's tiles' records."""
    records = WARPS * shape.m_tiles * 16 * RECORD_UNITS[layout] if weights_staged() else 0
    return 8 * shape.n_tiles * CHUNK * 2 + records


def stages_for(shape: Q4rShape, layout: int = LAYOUT_4BIT, limit: int = 227 * 1024) -> int:
    """Q4R_STAGES: as $PADDOCK_KERNEL_DEFINES sets it (an A/B build), else STAGES or as many as `limit` bytes
    of shared memory a block hold (at least two)."""
    chosen = envs.PADDOCK_KERNEL_DEFINES.get("Q4R_STAGES")
    if chosen is not None:
        return int(chosen)
    return max(2, min(STAGES, (limit - 1024) // stage_bytes(shape, layout)))  # 1 KB: the static shared memory


def shared_bytes(shape: Q4rShape, layout: int = LAYOUT_4BIT, stages: int = STAGES) -> int:
    """gemv_q4r.cu's SMEM_BYTES: the dynamic shared memory of a launch."""
    return stages * stage_bytes(shape, layout)


def serves(n_tok: int, n_cols: int) -> bool:
    return 1 <= n_tok <= MAX_TOKENS and n_cols % 256 == 0


ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}  # common.cuh's gated_act


def defines_of(
    shape: Q4rShape, layout: int = LAYOUT_4BIT, act: str | None = None, stages: int = STAGES
) -> dict[str, str | int]:
    return {"Q4R_MT": shape.m_tiles, "Q4R_NT": shape.n_tiles, "Q4R_FMT": layout,
            "Q4R_ACT": -1 if act is None else ACTIVATIONS[act], "Q4R_STAGES": stages}  # fmt: skip


_counters: dict[int, Any] = {}  # device id -> the split reduction's counters (left zero by every launch)


def _counters_for(blocks: int) -> Any:
    import cupy

    device = cupy.cuda.Device().id
    have = _counters.get(device)
    if have is None or have.size < blocks:
        have = _counters[device] = cupy.zeros(max(blocks, 4096), cupy.int32)
    return have


def gemv_q4r(
    weight: Q4rWeight, x: Any, out: Any, bias: Any | None = None, shape: Q4rShape | None = None, act: str | None = None
) -> Any:
    """`out = x @ W.T (+ bias)` for `x [T, n_cols]`, 1 <= T <= MAX_TOKENS, into C-contiguous float32
    `out [T, n_rows]`; with `act` (an interleaved gate/up weight) `out [T, n_rows / 2] = act(gate) * up`.
    x in float32 is rounded to float16 by a pre-pass; a C-contiguous float16 x (a norm kernel's output)
    is read as it is. `shape` overrides the launch shape (tests, benchmarks)."""
    import cupy

    n_tok = x.shape[0]
    if not serves(n_tok, weight.n_cols) or x.shape[1] != weight.n_cols:
        raise ValueError(f"gemv_q4r takes 1..{MAX_TOKENS} tokens of {weight.n_cols} columns, got {x.shape}")
    if act is not None and (act not in ACTIVATIONS or not weight.interleaved):
        raise ValueError(f"gemv_q4r applies {sorted(ACTIVATIONS)} to interleaved gate/up weights, not {act!r}")
    width = weight.n_rows // 2 if act is not None else weight.n_rows
    if out.shape != (n_tok, width) or not out.flags.c_contiguous:
        raise ValueError(f"gemv_q4r writes a C-contiguous [{n_tok}, {width}] output, not {out.shape}")
    shape = shape or device_shape(n_tok, weight.n_rows, weight.n_cols, weight.layout, act)
    main, smem, defines = _build(shape, weight.layout, act)
    if x.dtype == cupy.float16 and x.flags.c_contiguous:
        x16 = x
    else:
        x = cupy.ascontiguousarray(x, dtype=cupy.float32)
        x16 = cupy.empty(x.shape, cupy.float16)
        pre = get_kernel(SOURCE, "gemv_q4r_x16", defines)
        launch(pre, (max(1, min(cdiv(x.size // 4, X16_THREADS), 4 * MULTIPROCESSORS)),), (X16_THREADS,),
               (x, x16, i32(x.size)))  # fmt: skip
    blocks = cdiv(weight.n_rows, shape.rows())
    work = cupy.empty(shape.splits * n_tok * weight.n_rows, cupy.float32) if shape.splits > 1 else None
    counters = _counters_for(blocks) if shape.splits > 1 else None
    launch(main, (blocks, shape.splits), (32 * WARPS,),
           (weight.codes, weight.scales, weight.row_scale, i32(weight.n_rows), i32(weight.n_cols), x16, i32(n_tok),
            out, ptr(bias), ptr(work), ptr(counters), i32(weight.interleaved)), shared_mem=smem)  # fmt: skip
    return out


@functools.cache
def device_shape(n_tok: int, n_rows: int, n_cols: int, layout: int, act: str | None = None) -> Q4rShape:
    """pick_shape's shape with splits for as many blocks as the build keeps resident on this GPU (by its
    registers and shared memory): the launch shape of `gemv_q4r` where none is given."""
    shape = pick_shape(n_tok, n_rows, n_cols)
    kernel, smem, _ = _build(shape, layout, act)
    return pick_shape(n_tok, n_rows, n_cols, resident_blocks(kernel, 32 * WARPS, smem) * sm_count())


def _build(shape: Q4rShape, layout: int, act: str | None) -> tuple[Any, int, dict[str, str | int]]:
    """The product's kernel for this shape (its stages fitted to the device's shared memory), allowed its
    dynamic shared memory; that size, and the module's defines (the pre-pass comes from the same module)."""
    stages = stages_for(shape, layout, max_shared_bytes())
    defines = defines_of(shape, layout, act, stages)
    kernel = get_kernel(SOURCE, "gemv_q4r", defines)
    smem = shared_bytes(shape, layout, stages)
    allow_shared(kernel, smem)
    return kernel, smem, defines
