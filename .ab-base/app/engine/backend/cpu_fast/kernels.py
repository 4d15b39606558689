"""The fast CPU products, in numba: GGUF rows times float32 activations, float32 accumulation.

`decode_*` turn one row's bytes (uint8, a whole number of blocks) into float32 with the same
operations in the same order as `app/engine/quant/reference.py` (`d * sc` first, then `* q - dmin
* m`, ...), so a decoded row equals the numpy oracle bit for bit and the products differ from the
oracle only in summation order. fp16 fields are read through `f16`, a 65,536-entry table of every
half value (ggml's `ggml_table_f32_f16`): exact, one load per block. Each kernel is made per format
(`make_gemv`, `make_dequantize`) and compiled for that format alone.

`gemv` serves a decode step (one activation row): quantized rows are read in place, two at a time,
each block's codes multiplied into the sums as they are unpacked. `gemm_rows` serves 2..16 rows (a
speculative verify chunk, a small batch): each pair of weight rows is decoded once into L1-resident
buffers and dotted with every activation row, so the decode is paid once per step whatever the rows,
and a row's result is the same bits in any such chunk. `dequantize` decodes the rows of a tile for
prefill's BLAS products (backend.py) or the rows an embedding lookup needs.

The kernels release the GIL (`nogil`) and split weight rows over numba's threads (`prange`);
`fastmath` is limited to reassociation, which lets LLVM vectorise the dot products' sums and
leaves the decode arithmetic (no contraction into FMAs) equal to the oracle's. Everything lives in
this one file on purpose: numba's on-disk cache (`cache=True`) is invalidated by the cached
function's own source file only, so a decoder kept in another module could go stale in the cache.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from app.engine.quant.types import QK_K

FORMAT_CODES = {"F16": 1, "BF16": 2, "Q4_0": 3, "Q4_1": 4, "Q5_0": 5, "Q5_1": 6, "Q8_0": 7,
                "Q4_K": 8, "Q5_K": 9, "Q6_K": 10}  # fmt: skip


def half_table() -> np.ndarray:
    """float32 value of every fp16 bit pattern, indexed by the pattern."""
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


@njit(inline="always")
def _half(row: np.ndarray, offset: int, f16: np.ndarray) -> np.float32:
    return f16[np.int64(row[offset]) | (np.int64(row[offset + 1]) << 8)]


# Style, for LLVM's vectoriser: each block's bytes are a slice indexed by loop counters only, and
# integers stay int32 before the float conversion (numba widens mixed integer arithmetic to int64,
# whose conversion to float32 is far slower); measured ~6x on the Q8_0 product.
_LOW, _FOUR = np.uint8(0x0F), np.uint8(4)


@njit(inline="always")
def decode_f16(row, out, f16):
    bits = row.view(np.uint16)
    for j in range(out.shape[0]):
        out[j] = f16[bits[j]]


@njit(inline="always")
def decode_bf16(row, out, f16):
    src, dst = row.view(np.uint16), out.view(np.uint32)  # bf16 is the top half of a float32
    for j in range(out.shape[0]):
        dst[j] = np.uint32(src[j]) << np.uint32(16)


@njit(inline="always")
def decode_q8_0(row, out, f16):
    for b in range(out.shape[0] // 32):
        blk, dst = row[34 * b : 34 * b + 34], out[32 * b : 32 * b + 32]
        d, q = _half(blk, 0, f16), blk[2:].view(np.int8)
        for j in range(32):
            dst[j] = d * np.float32(np.int32(q[j]))


@njit(inline="always")
def _legacy_4bit(row, out, f16, size, qs, has_min, has_high):
    """Q4_0, Q4_1, Q5_0, Q5_1: 32 values per block, nibbles from byte `qs`, fifth bits at bytes 2 or 4."""
    offset = np.float32(16.0 if has_high else 8.0)
    for b in range(out.shape[0] // 32):
        blk, dst = row[size * b : size * b + size], out[32 * b : 32 * b + 32]
        nib = blk[qs : qs + 16]
        d = _half(blk, 0, f16)
        m = _half(blk, 2, f16) if has_min else np.float32(0.0)
        hb = 4 if has_min else 2
        high = np.uint32(0)
        if has_high:
            high = (np.uint32(blk[hb]) | (np.uint32(blk[hb + 1]) << np.uint32(8))
                    | (np.uint32(blk[hb + 2]) << np.uint32(16)) | (np.uint32(blk[hb + 3]) << np.uint32(24)))  # fmt: skip
        for j in range(16):
            lo, hi = np.int32(nib[j] & _LOW), np.int32(nib[j] >> _FOUR)
            if has_high:
                lo |= np.int32((high >> np.uint32(j)) & np.uint32(1)) << np.int32(4)
                hi |= np.int32((high >> np.uint32(j + 16)) & np.uint32(1)) << np.int32(4)
            if has_min:
                dst[j] = d * np.float32(lo) + m
                dst[j + 16] = d * np.float32(hi) + m
            else:
                dst[j] = d * (np.float32(lo) - offset)
                dst[j + 16] = d * (np.float32(hi) - offset)


@njit(inline="always")
def _k_scale_min(scales, s):
    """Sub-block `s`'s 6-bit scale and min from the 12 scale bytes (ggml's get_scale_min_k4)."""
    if s < 4:
        return np.float32(scales[s] & 63), np.float32(scales[s + 4] & 63)
    sc = (scales[s + 4] & 0x0F) | ((scales[s - 4] >> 6) << 4)
    mn = (scales[s + 4] >> 4) | ((scales[s] >> 6) << 4)
    return np.float32(sc), np.float32(mn)


@njit(inline="always")
def _k_value(nib, high, j, shift, hs, has_high):
    """Value j of a Q4_K/Q5_K sub-block: its nibble, plus the fifth bit (bit `hs` of high[j]) for Q5_K."""
    q = np.int32((nib[j] >> shift) & _LOW)
    if has_high:
        q |= np.int32((high[j] >> hs) & np.uint8(1)) << np.int32(4)
    return q


@njit(inline="always")
def _k_4_5(row, out, f16, size, has_high):
    """Q4_K (144-byte blocks) and Q5_K (176: 32 bytes of fifth bits before the nibbles)."""
    qs = 48 if has_high else 16
    for b in range(out.shape[0] // QK_K):
        blk = row[size * b : size * b + size]
        d, dmin = _half(blk, 0, f16), _half(blk, 2, f16)
        scales, high = blk[4:16], blk[16:48]
        for s in range(8):
            sc, mn = _k_scale_min(scales, s)
            ds, dm = d * sc, dmin * mn
            nib = blk[qs + 32 * (s // 2) : qs + 32 * (s // 2) + 32]
            dst = out[QK_K * b + 32 * s : QK_K * b + 32 * s + 32]
            shift, hs = np.uint8(4 * (s % 2)), np.uint8(s)
            for j in range(32):
                dst[j] = ds * np.float32(_k_value(nib, high, j, shift, hs, has_high)) - dm


@njit(inline="always")
def decode_q6_k(row, out, f16):
    for b in range(out.shape[0] // QK_K):
        blk = row[210 * b : 210 * b + 210]
        d, scales = _half(blk, 208, f16), blk[192:208].view(np.int8)
        for h in range(2):
            for k in range(4):
                low = blk[64 * h + 32 * (k % 2) : 64 * h + 32 * (k % 2) + 32]
                high = blk[128 + 32 * h : 128 + 32 * h + 32]
                shift, hshift = np.uint8(4 * (k // 2)), np.uint8(2 * k)
                for half in range(2):  # two sub-blocks of 16, each with its own int8 scale
                    ds = d * np.float32(np.int32(scales[8 * h + 2 * k + half]))
                    first = QK_K * b + 128 * h + 32 * k + 16 * half
                    dst = out[first : first + 16]
                    for j in range(16):
                        lo = np.int32((low[16 * half + j] >> shift) & _LOW)
                        hi = np.int32((high[16 * half + j] >> hshift) & np.uint8(3))
                        dst[j] = ds * np.float32((lo | (hi << np.int32(4))) - np.int32(32))


_FLAGS = dict(nogil=True, cache=True, fastmath={"reassoc"}, error_model="numpy")
# The products also contract multiply-adds into FMAs (a rounding difference of the kind summation
# order already makes); they decode no stored value, so nothing there must equal the oracle bit for bit.
_PRODUCT_FLAGS = dict(_FLAGS, fastmath={"reassoc", "contract"})
ROWS_PER_TASK = 16  # weight rows per parallel chunk: one scratch buffer each, enough work per task
PREFETCH_BYTES = 4096  # how far ahead of the row being read `gemv` asks for the weights' bytes


@intrinsic
def _prefetch(typingctx, data, offset):
    """Ask the cache for the line holding byte `offset` of the C-contiguous uint8 array `data`
    (LLVM's llvm.prefetch: a hint, no fault past the end). The hardware prefetcher alone left a
    single thread at ~2.5 GB/s through the 178 MB vocabulary matrix on this VM (3 GMAC/s on Q8_0);
    asking 4 KiB ahead made the same product 2.6x faster (7.8 GMAC/s, near its in-cache rate)."""
    if not (isinstance(data, types.Array) and data.dtype == types.uint8 and data.layout == "C"):
        return None

    def codegen(context, builder, signature, args):
        array = context.make_array(signature.args[0])(context, builder, args[0])
        address = builder.gep(array.data, [args[1]])
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [address.type, i32, i32, i32]), "llvm.prefetch.p0"
        )
        builder.call(fn, [address, i32(0), i32(3), i32(1)])  # read, keep in all levels, data cache
        return context.get_dummy_value()

    return types.void(data, types.intp), codegen


@njit(inline="always")
def _prefetch_ahead(data, r):
    """Prefetch the bytes PREFETCH_BYTES past the start of row `r` (a row's worth, a line at a time)."""
    row_bytes = data.shape[1]
    first = min(r * row_bytes + PREFETCH_BYTES, data.size - 1)
    for c in range(0, row_bytes, 64):
        _prefetch(data, min(first + c, data.size - 1))


GROUP = 32  # values per quant group; passed to the kernels at run time, see `dot_quant`


@njit(inline="always")
def _q8(v):
    """uint8 -> its int8 value as float32; the xor form vectorises (a plain int8 view did not)."""
    return np.float32(np.int32(v ^ np.uint8(0x80)) - np.int32(128))


@njit(inline="always")
def _high_bits(blk, at, has_high):
    """The 32 fifth bits of a Q5_0/Q5_1 block (little-endian at byte `at`); 0 for Q4_0/Q4_1."""
    if not has_high:
        return np.uint32(0)
    return np.uint32(np.uint32(blk[at]) | (np.uint32(blk[at + 1]) << np.uint32(8))
                     | (np.uint32(blk[at + 2]) << np.uint32(16)) | (np.uint32(blk[at + 3]) << np.uint32(24)))  # fmt: skip


# Bit j of a Q5_0/Q5_1 block's fifth bits, tested by a mask (`high & _BIT[j]`) rather than a shift by
# j: numba types the shift amount int64, and LLVM then shifts in 64-bit lanes and repacks (twice the
# instructions of the whole loop body on AVX2); a mask and a compare stay in 32-bit lanes.
_BIT = np.array([1 << j for j in range(32)], dtype=np.uint32)


@intrinsic
def _bit_or_16(typingctx, value, bits, mask):
    """`value | (16 if bits & mask else 0)` in 32-bit arithmetic (int32 value, uint32 bits and mask):
    numba's own typing would widen the test to 64 bits, and LLVM's vectoriser keeps the width."""
    if not (value == types.int32 and bits == types.uint32 and mask == types.uint32):
        return None

    def codegen(context, builder, signature, args):
        v, b, m = args
        i32 = ir.IntType(32)
        hit = builder.icmp_unsigned("!=", builder.and_(b, m), i32(0))
        return builder.or_(v, builder.select(hit, i32(16), i32(0)))

    return types.int32(value, bits, mask), codegen


@njit(inline="always")
def _legacy_pair(nib, high, j, has_high):
    """Values j and j + 16 of a legacy block, unsigned: byte j's nibbles plus their fifth bits."""
    lo, hi = np.int32(nib[j] & _LOW), np.int32(nib[j] >> _FOUR)
    if has_high:
        lo = _bit_or_16(lo, high, _BIT[j])
        hi = _bit_or_16(hi, high, _BIT[j + 16])
    return np.float32(lo), np.float32(hi)


# The products below take two weight rows at once: their two sums are independent chains in one
# vectorised loop over the group (twice the work per loop overhead and per horizontal sum), which
# measured 1.6x the one-row form on Q5_0. A row's result does not depend on its partner row.


@njit(inline="always")
def _dot_legacy(row0, row1, x, xs, f16, g, size, qs, has_min, has_high):
    """Q4_0, Q4_1, Q5_0, Q5_1 (see _legacy_4bit) times x, two rows: per block d * (sum(q x) - 8|16 *
    sum(x)), or d * sum(q x) + m * sum(x)."""
    half = g >> 1
    offset = np.float32(0.0 if has_min else (16.0 if has_high else 8.0))
    hb = 4 if has_min else 2
    acc0, acc1 = np.float32(0.0), np.float32(0.0)
    for b in range(x.shape[0] // 32):
        blk0, blk1, xb = (
            row0[size * b : size * b + size],
            row1[size * b : size * b + size],
            x[32 * b : 32 * b + 32],
        )
        nib0, nib1 = blk0[qs : qs + 16], blk1[qs : qs + 16]
        high0, high1 = _high_bits(blk0, hb, has_high), _high_bits(blk1, hb, has_high)
        s0, s1 = np.float32(0.0), np.float32(0.0)
        for j in range(half):
            lo0, hi0 = _legacy_pair(nib0, high0, j, has_high)
            lo1, hi1 = _legacy_pair(nib1, high1, j, has_high)
            s0 += lo0 * xb[j] + hi0 * xb[j + 16]
            s1 += lo1 * xb[j] + hi1 * xb[j + 16]
        acc0 += _half(blk0, 0, f16) * (s0 - offset * xs[b])
        acc1 += _half(blk1, 0, f16) * (s1 - offset * xs[b])
        if has_min:
            acc0 += _half(blk0, 2, f16) * xs[b]
            acc1 += _half(blk1, 2, f16) * xs[b]
    return acc0, acc1


@njit(inline="always")
def _dot_k_4_5(row0, row1, x, xs, f16, g, size, has_high):
    """Q4_K / Q5_K times x, two rows: per sub-block (d * scale) * sum(q x) - (dmin * min) * sum(x)."""
    qs = 48 if has_high else 16
    acc0, acc1 = np.float32(0.0), np.float32(0.0)
    for b in range(x.shape[0] // QK_K):
        blk0, blk1 = row0[size * b : size * b + size], row1[size * b : size * b + size]
        d0, dmin0, d1, dmin1 = (
            _half(blk0, 0, f16),
            _half(blk0, 2, f16),
            _half(blk1, 0, f16),
            _half(blk1, 2, f16),
        )
        high0, high1 = blk0[16:48], blk1[16:48]
        for s in range(8):
            sc0, mn0 = _k_scale_min(blk0[4:16], s)
            sc1, mn1 = _k_scale_min(blk1[4:16], s)
            first = qs + 32 * (s // 2)
            nib0, nib1 = blk0[first : first + 32], blk1[first : first + 32]
            xb = x[QK_K * b + 32 * s : QK_K * b + 32 * s + 32]
            shift, hs = np.uint8(4 * (s % 2)), np.uint8(s)
            hmask = 1 if has_high else 0
            part0, part1 = np.float32(0.0), np.float32(0.0)
            for j in range(g):
                part0 += np.float32(_quant(nib0[j], high0[j], shift, hs, hmask, 0)) * xb[j]
                part1 += np.float32(_quant(nib1[j], high1[j], shift, hs, hmask, 0)) * xb[j]
            acc0 += (d0 * sc0) * part0 - (dmin0 * mn0) * xs[8 * b + s]
            acc1 += (d1 * sc1) * part1 - (dmin1 * mn1) * xs[8 * b + s]
    return acc0, acc1


@intrinsic
def _quant(typingctx, low, high, low_shift, high_shift, high_mask, offset):
    """A K-quant value as int32: `((low >> low_shift) & 15) | (((high >> high_shift) & high_mask) << 4)
    - offset` from two uint8 bytes (Q4_K: high_mask 0; Q5_K: 1; Q6_K: 3, offset 32), in 32-bit
    arithmetic. numba's typing widens each step to 64 bits, and where shifts and masks mix, LLVM's
    vectoriser kept 64-bit lanes (twice the instructions, and a repack before the float conversion)."""
    if not (low == types.uint8 and high == types.uint8):
        return None
    if not all(isinstance(a, types.Integer) for a in (low_shift, high_shift, high_mask, offset)):
        return None

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        lo, hi = builder.zext(args[0], i32), builder.zext(args[1], i32)
        ls, hs, hm, off = (builder.trunc(a, i32) if a.type.width > 32 else builder.zext(a, i32) for a in args[2:])
        lo = builder.and_(builder.lshr(lo, ls), i32(15))
        hi = builder.shl(builder.and_(builder.lshr(hi, hs), hm), i32(4))
        return builder.sub(builder.or_(lo, hi), off)

    return types.int32(low, high, low_shift, high_shift, high_mask, offset), codegen


@njit(inline="always")
def _q6_four(low, high, j):
    """Values j, j + 32, j + 64, j + 96 of a Q6_K half-block (its 64 low bytes, 32 high bytes), as
    float32. One pass over j yields all four with constant shifts, which stay in narrow lanes; a
    variable shift per quarter (the decode's loop order) widened them to 64 bits."""
    l0, l1, hb = low[j], low[j + 32], high[j]
    return (np.float32(_quant(l0, hb, 0, 0, 3, 32)), np.float32(_quant(l1, hb, 0, 2, 3, 32)),
            np.float32(_quant(l0, hb, 4, 4, 3, 32)), np.float32(_quant(l1, hb, 4, 6, 3, 32)))  # fmt: skip


@njit(inline="always")
def _dot_q6_k(row0, row1, x, f16, g):
    """Q6_K times x, two rows: per sub-block of 16 (d * scale) * sum(q x). Each pass over 16 values j
    of a half-block covers the four sub-blocks j, j + 32, j + 64, j + 96 (scales 2k + part)."""
    half = g >> 1
    acc0, acc1 = np.float32(0.0), np.float32(0.0)
    for b in range(x.shape[0] // QK_K):
        blk0, blk1 = row0[210 * b : 210 * b + 210], row1[210 * b : 210 * b + 210]
        d0, d1 = _half(blk0, 208, f16), _half(blk1, 208, f16)
        for h in range(2):
            low0, low1 = blk0[64 * h : 64 * h + 64], blk1[64 * h : 64 * h + 64]
            high0, high1 = blk0[128 + 32 * h : 160 + 32 * h], blk1[128 + 32 * h : 160 + 32 * h]
            xh = x[QK_K * b + 128 * h : QK_K * b + 128 * h + 128]
            for part in range(2):  # values 0-15 and 16-31 of each quarter: their own int8 scales
                a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = np.float32(0.0)
                for j in range(16 * part, 16 * part + half):
                    v0, v1, v2, v3 = _q6_four(low0, high0, j)
                    w0, w1, w2, w3 = _q6_four(low1, high1, j)
                    x0, x1, x2, x3 = xh[j], xh[j + 32], xh[j + 64], xh[j + 96]
                    a0 += v0 * x0
                    a1 += v1 * x1
                    a2 += v2 * x2
                    a3 += v3 * x3
                    b0 += w0 * x0
                    b1 += w1 * x1
                    b2 += w2 * x2
                    b3 += w3 * x3
                sc = 192 + 8 * h + part  # scale of quarter k: sc + 2k
                acc0 += d0 * (_q8(blk0[sc]) * a0 + _q8(blk0[sc + 2]) * a1
                              + _q8(blk0[sc + 4]) * a2 + _q8(blk0[sc + 6]) * a3)  # fmt: skip
                acc1 += d1 * (_q8(blk1[sc]) * b0 + _q8(blk1[sc + 2]) * b1
                              + _q8(blk1[sc + 4]) * b2 + _q8(blk1[sc + 6]) * b3)  # fmt: skip
    return acc0, acc1


@njit(inline="always")
def _dot_q8_0(row0, row1, x, f16, g):
    acc0, acc1 = np.float32(0.0), np.float32(0.0)
    for b in range(x.shape[0] // 32):
        blk0, blk1, xb = row0[34 * b : 34 * b + 34], row1[34 * b : 34 * b + 34], x[32 * b : 32 * b + 32]
        s0, s1 = np.float32(0.0), np.float32(0.0)
        for j in range(g):
            s0 += _q8(blk0[2 + j]) * xb[j]
            s1 += _q8(blk1[2 + j]) * xb[j]
        acc0 += _half(blk0, 0, f16) * s0
        acc1 += _half(blk1, 0, f16) * s1
    return acc0, acc1


# Why each kernel below picks its format with an if-chain in its own body, on `code` (a constant of
# the closure): numba prunes dead branches on constants before it inlines the `inline="always"`
# helpers, and not inside them afterwards. With the chain in an inlined helper (`decode_row(code, ...)`)
# every kernel compiled all ten formats' code: ~8 s per kernel on this VM where its own format takes
# 1.5-7 s, some 5 minutes of a cold test run over the ten formats.


def make_gemv(name: str):
    """The decode product for one format. Each format is its own closure (the format code is a
    constant of it), compiled on first call and cached on disk per format: a model compiles only
    the formats it holds."""
    code = FORMAT_CODES[name]
    is_float = name in ("F16", "BF16")

    @njit(parallel=True, **_PRODUCT_FLAGS)
    def gemv(data, f16, x, xs, out, col0, g):  # pragma: no cover - compiled by numba
        """`out[i, col0 + r] = dot(decode(data[r]), x[i])` for every weight row r and activation row i.

        Float rows (F16, BF16) are decoded into a per-task buffer first; quantized rows are read in
        place. `xs[i, j]` is the sum of `x[i, 32 j : 32 j + 32]`; `g` is GROUP: a trip count LLVM
        cannot see, so it vectorises the loop over a group's values instead of fully unrolling it and
        vectorising across blocks with gathers (3.6x slower on Q8_0)."""
        n_rows, n_x, width = data.shape[0], x.shape[0], x.shape[1]
        for task in prange((n_rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
            buf = np.empty(width if is_float else 0, np.float32)
            stop = min(n_rows, (task + 1) * ROWS_PER_TASK)
            for r in range(task * ROWS_PER_TASK, stop, 1 if is_float else 2):
                _prefetch_ahead(data, r)
                if is_float:
                    if code == 1:
                        decode_f16(data[r], buf, f16)
                    else:
                        decode_bf16(data[r], buf, f16)
                    for i in range(n_x):
                        acc = np.float32(0.0)
                        for k in range(width):
                            acc += buf[k] * x[i, k]
                        out[i, col0 + r] = acc
                    continue
                # rows in pairs (2t, 2t + 1); an odd last row pairs with itself
                r1 = min(r + 1, stop - 1)
                _prefetch_ahead(data, r1)
                row0, row1 = data[r], data[r1]
                for i in range(n_x):
                    if code == 7:
                        a, b = _dot_q8_0(row0, row1, x[i], f16, g)
                    elif code == 8:
                        a, b = _dot_k_4_5(row0, row1, x[i], xs[i], f16, g, 144, False)
                    elif code == 9:
                        a, b = _dot_k_4_5(row0, row1, x[i], xs[i], f16, g, 176, True)
                    elif code == 10:
                        a, b = _dot_q6_k(row0, row1, x[i], f16, g)
                    elif code == 3:
                        a, b = _dot_legacy(row0, row1, x[i], xs[i], f16, g, 18, 2, False, False)
                    elif code == 4:
                        a, b = _dot_legacy(row0, row1, x[i], xs[i], f16, g, 20, 4, True, False)
                    elif code == 5:
                        a, b = _dot_legacy(row0, row1, x[i], xs[i], f16, g, 22, 6, False, True)
                    else:
                        a, b = _dot_legacy(row0, row1, x[i], xs[i], f16, g, 24, 8, True, True)
                    out[i, col0 + r], out[i, col0 + r1] = a, b

    return gemv


def make_dequantize(name: str):
    """`dequantize(data, f16, rows, out)` for one format: `out[j] = decode(data[rows[j]])`, for
    prefill's tiles (consecutive rows) and embedding lookups alike."""
    code = FORMAT_CODES[name]

    @njit(parallel=True, **_FLAGS)
    def dequantize(data, f16, rows, out):  # pragma: no cover - compiled by numba
        for j in prange(rows.shape[0]):
            row, dst = data[rows[j]], out[j]
            if code == 7:
                decode_q8_0(row, dst, f16)
            elif code == 8:
                _k_4_5(row, dst, f16, 144, False)
            elif code == 9:
                _k_4_5(row, dst, f16, 176, True)
            elif code == 10:
                decode_q6_k(row, dst, f16)
            elif code == 3:
                _legacy_4bit(row, dst, f16, 18, 2, False, False)
            elif code == 4:
                _legacy_4bit(row, dst, f16, 20, 4, True, False)
            elif code == 5:
                _legacy_4bit(row, dst, f16, 22, 6, False, True)
            elif code == 6:
                _legacy_4bit(row, dst, f16, 24, 8, True, True)
            elif code == 1:
                decode_f16(row, dst, f16)
            else:
                decode_bf16(row, dst, f16)

    return dequantize


# Decoders for the few-row product: the `decode_*` values (the same float operations, so equal to the
# oracle's) written in the products' vectorising style (runtime group trip counts, 32-bit integers, the
# xor int8 form), which the oracle-order decoders above are not: they ran 5x slower than one fused
# row product on the Q8_0 vocabulary matrix.


@njit(inline="always")
def _unpack_q8_0(row, dst, f16, g):
    for b in range(dst.shape[0] // 32):
        blk, out = row[34 * b : 34 * b + 34], dst[32 * b : 32 * b + 32]
        d = _half(blk, 0, f16)
        for j in range(g):
            out[j] = d * _q8(blk[2 + j])


@njit(inline="always")
def _unpack_legacy(row, dst, f16, g, size, qs, has_min, has_high):
    half = g >> 1
    offset = np.float32(16.0 if has_high else 8.0)
    hb = 4 if has_min else 2
    for b in range(dst.shape[0] // 32):
        blk, out = row[size * b : size * b + size], dst[32 * b : 32 * b + 32]
        nib = blk[qs : qs + 16]
        d = _half(blk, 0, f16)
        m = _half(blk, 2, f16) if has_min else np.float32(0.0)
        high = _high_bits(blk, hb, has_high)
        for j in range(half):
            lo, hi = _legacy_pair(nib, high, j, has_high)
            if has_min:
                out[j] = d * lo + m
                out[j + 16] = d * hi + m
            else:
                out[j] = d * (lo - offset)
                out[j + 16] = d * (hi - offset)


@njit(inline="always")
def _unpack_k_4_5(row, dst, f16, g, size, has_high):
    qs = 48 if has_high else 16
    hmask = 1 if has_high else 0
    for b in range(dst.shape[0] // QK_K):
        blk = row[size * b : size * b + size]
        d, dmin = _half(blk, 0, f16), _half(blk, 2, f16)
        high = blk[16:48]
        for s in range(8):
            sc, mn = _k_scale_min(blk[4:16], s)
            ds, dm = d * sc, dmin * mn
            first = qs + 32 * (s // 2)
            nib = blk[first : first + 32]
            out = dst[QK_K * b + 32 * s : QK_K * b + 32 * s + 32]
            shift, hs = np.uint8(4 * (s % 2)), np.uint8(s)
            for j in range(g):
                out[j] = ds * np.float32(_quant(nib[j], high[j], shift, hs, hmask, 0)) - dm


@njit(inline="always")
def _unpack_q6_k(row, dst, f16, g):
    half = g >> 1
    for b in range(dst.shape[0] // QK_K):
        blk = row[210 * b : 210 * b + 210]
        d = _half(blk, 208, f16)
        for h in range(2):
            low, high = blk[64 * h : 64 * h + 64], blk[128 + 32 * h : 160 + 32 * h]
            out = dst[QK_K * b + 128 * h : QK_K * b + 128 * h + 128]
            for part in range(2):
                sc = 192 + 8 * h + part  # scale of quarter k: sc + 2k
                d0, d1 = d * _q8(blk[sc]), d * _q8(blk[sc + 2])
                d2, d3 = d * _q8(blk[sc + 4]), d * _q8(blk[sc + 6])
                for j in range(16 * part, 16 * part + half):
                    v0, v1, v2, v3 = _q6_four(low, high, j)
                    out[j], out[j + 32], out[j + 64], out[j + 96] = d0 * v0, d1 * v1, d2 * v2, d3 * v3


def make_gemm_rows(name: str):
    """The product for a few activation rows (a speculative verify chunk, a small batch): each pair of
    weight rows is decoded ONCE into two L1-resident float32 buffers, then dotted with every
    activation row. `gemv` reads its rows in place and decodes them again for each activation row,
    which at 8 rows cost 7x one row; here the decode is paid once and each further row adds only
    its dot products (a multiply-add per value against the buffers)."""
    code = FORMAT_CODES[name]

    @njit(parallel=True, **_PRODUCT_FLAGS)
    def gemm_rows(data, f16, x, out, col0, g):  # pragma: no cover - compiled by numba
        """`out[i, col0 + r] = dot(decode(data[r]), x[i])` for every weight row r and activation row i;
        row `i`'s result is the same bits whatever the other rows (its own dot product)."""
        n_rows, n_x, width = data.shape[0], x.shape[0], x.shape[1]
        for task in prange((n_rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
            buf = np.empty((2, width), np.float32)
            stop = min(n_rows, (task + 1) * ROWS_PER_TASK)
            for r in range(task * ROWS_PER_TASK, stop, 2):
                r1 = min(r + 1, stop - 1)  # an odd last row pairs with itself
                for which in range(2):
                    row, dst = data[r + which * (r1 - r)], buf[which]
                    _prefetch_ahead(data, r + which * (r1 - r))
                    if code == 7:
                        _unpack_q8_0(row, dst, f16, g)
                    elif code == 8:
                        _unpack_k_4_5(row, dst, f16, g, 144, False)
                    elif code == 9:
                        _unpack_k_4_5(row, dst, f16, g, 176, True)
                    elif code == 10:
                        _unpack_q6_k(row, dst, f16, g)
                    elif code == 3:
                        _unpack_legacy(row, dst, f16, g, 18, 2, False, False)
                    elif code == 4:
                        _unpack_legacy(row, dst, f16, g, 20, 4, True, False)
                    elif code == 5:
                        _unpack_legacy(row, dst, f16, g, 22, 6, False, True)
                    elif code == 6:
                        _unpack_legacy(row, dst, f16, g, 24, 8, True, True)
                    elif code == 1:
                        decode_f16(row, dst, f16)
                    else:
                        decode_bf16(row, dst, f16)
                w0, w1 = buf[0], buf[1]
                # activation rows four at a time, the last ones repeated to fill a four (as the last
                # weight row pairs with itself): each row's sums are the same loop whatever its partners
                for i in range(0, n_x, 4):
                    i1, i2, i3 = min(i + 1, n_x - 1), min(i + 2, n_x - 1), min(i + 3, n_x - 1)
                    x0, x1, x2, x3 = x[i], x[i1], x[i2], x[i3]
                    a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = np.float32(0.0)
                    for k in range(width):
                        u, v = w0[k], w1[k]
                        a0 += u * x0[k]
                        a1 += u * x1[k]
                        a2 += u * x2[k]
                        a3 += u * x3[k]
                        b0 += v * x0[k]
                        b1 += v * x1[k]
                        b2 += v * x2[k]
                        b3 += v * x3[k]
                    out[i, col0 + r], out[i, col0 + r1] = a0, b0
                    out[i1, col0 + r], out[i1, col0 + r1] = a1, b1
                    out[i2, col0 + r], out[i2, col0 + r1] = a2, b2
                    out[i3, col0 + r], out[i3, col0 + r1] = a3, b3

    return gemm_rows
