"""Wrapper of attention_prefill.cu: paged causal attention for prefill chunks on tensor cores."""

from __future__ import annotations

from functools import cache
from typing import Any

from app.engine import envs
from app.engine.kernels.kv_format import kv_operands
from app.engine.kernels.runtime.compile import get_kernel
from app.engine.kernels.runtime.launch import (
    LEAST_OPT_IN_SHARED_BYTES,
    allow_shared,
    cdiv,
    f32,
    i32,
    launch,
    max_shared_bytes,
    ptr,
)

THREADS = 128  # PF_WARPS * 32
PAD = 8  # PF_PAD
HEAD_DIMS = (64, 128, 256, 512)  # 512 where the device's shared memory takes it (fits_device)
RESIDENT = 2  # blocks per multiprocessor the register budget allows (128 threads at ~240 registers)
MIN_KEYS_PER_SPLIT = 256  # below this a split's partial sums cost more than its keys
MAX_SPLITS = 32  # attn_prefill_merge takes at most this many: a lane of one warp each
MAX_PARTIAL_BYTES = 64 << 20
# Head dim 128's tile where the device's opt-in shared memory holds its 102 KB (sm_80, sm_90): 64 keys with V
# double-buffered (255 registers, no spill; 32 keys and one V buffer spill 16 bytes). The last 2,048-token chunk
# of an 8k / 32k prompt took 1.68 / 6.61 ms against 1.84 / 7.30 (H200, 2026-12-07, bench/results/gpu-s23).
# Float16 caches only: the FP8 build's loads are synchronous and its wide tile spills (unmeasured).
WIDE_TILE = {"PF_BN": 64, "PF_VBUF": 2}
# The build whose four warps share a block's rows and split each tile's keys (PF_KEY_WARPS; 64 keys a tile, V a
# tile ahead, the next K and V issued before a tile's products): for a few rows over many keys, a cascade decode's
# shared part, where the other build leaves three warps of four on padding rows.
KEY_WARPS = {"PF_KEY_WARPS": 1, "PF_VBUF": 2}
KEY_WARP_KEYS = 64  # PfShape::BN of that build: 16 keys a warp


def rows_per_block(head_dim: int, key_warps: bool = False) -> int:
    """PfShape::BM: (token, query head) rows per block, two 16-row tiles per warp below head dim 256; in the
    key-split build the warps share them."""
    rows = 16 if head_dim >= 256 else 32
    return rows if key_warps else 4 * rows


def keys_per_tile(head_dim: int, wide: bool = False, key_warps: bool = False) -> int:
    """PfShape::BN: the key-split build's 64, else PF_BN where $PADDOCK_KERNEL_DEFINES sets it (an A/B build), else
    the wide tile's or by head dim."""
    if key_warps:
        return KEY_WARP_KEYS
    return int(envs.PADDOCK_KERNEL_DEFINES.get("PF_BN", 0)) or (64 if head_dim <= 64 or wide else 32)


def value_columns(head_dim: int) -> int:
    """PfShape::DV: the value columns one block accumulates (a 512-wide head takes two blocks)."""
    return min(head_dim, 256)


def value_buffers(wide: bool = False, key_warps: bool = False) -> int:
    """PF_VBUF: the key-split build's 2, else as $PADDOCK_KERNEL_DEFINES sets it (an A/B build), else 2 in the wide
    tile and 1 elsewhere."""
    if key_warps:
        return 2
    return int(envs.PADDOCK_KERNEL_DEFINES.get("PF_VBUF", 2 if wide else 1))


def shared_bytes(head_dim: int, wide: bool = False, key_warps: bool = False) -> int:
    """PF_SMEM_BYTES: Q, two K buffers and PF_VBUF V buffers of the block's value columns, rows padded; in the
    key-split build at least each warp's float32 (max, sum) and O of the block's rows, which its end puts there."""
    keys = keys_per_tile(head_dim, wide, key_warps)
    rows = rows_per_block(head_dim, key_warps)
    q_k = (rows + 2 * keys) * (head_dim + PAD)
    tiles = (q_k + value_buffers(wide, key_warps) * keys * (value_columns(head_dim) + PAD)) * 2
    combine = 4 * rows * (value_columns(head_dim) + 2) * 4 if key_warps else 0
    return max(tiles, combine)


def key_warps_fit(head_dim: int) -> bool:
    """Whether the key-split build of `head_dim` fits this device's shared memory (every head dim to 128 does; 256
    takes 143 KB: sm_80 and sm_90)."""
    smem = shared_bytes(head_dim, key_warps=True)
    return head_dim in HEAD_DIMS and (smem <= LEAST_OPT_IN_SHARED_BYTES or smem <= max_shared_bytes())


@cache
def wide_tile(head_dim: int, fp8: bool) -> bool:
    """Whether this device builds `head_dim` with WIDE_TILE (asked once per head dim: the device stays)."""
    return head_dim == 128 and not fp8 and shared_bytes(head_dim, wide=True) <= max_shared_bytes()


def supports(head_dim: int, n_heads: int, n_kv: int) -> bool:
    """Whether a build exists for these heads and fits this device: every head dim but 512 fits all of
    sm_80 to sm_120 (256 with two V buffers: 99 KB, just); 512's 146 KB (163 KB) needs sm_80 or sm_90, as
    does an A/B build's larger tile (PF_BN) past 99 KB (elsewhere attention.cu runs those layers)."""
    if head_dim not in HEAD_DIMS or n_kv <= 0 or n_heads % n_kv:
        return False
    smem = shared_bytes(head_dim)
    return smem <= LEAST_OPT_IN_SHARED_BYTES or smem <= max_shared_bytes()


def grid_tiles(n_tok: int, n_seqs: int, group: int, head_dim: int, key_warps: bool = False) -> int:
    """Blocks along x: every sequence's cdiv(q_len * group, rows per block) tiles fit in this bound."""
    return cdiv(n_tok * group, rows_per_block(head_dim, key_warps)) + n_seqs


def plan_splits(
    n_tok: int, n_seqs: int, n_heads: int, n_kv: int, max_seq_len: int, sm_count: int, head_dim: int
) -> int:
    """KV splits for a batch whose tiles alone would not fill the GPU (a short chunk over a
    long cached context): about two waves of resident blocks, each split at least
    MIN_KEYS_PER_SPLIT keys, partial sums within MAX_PARTIAL_BYTES."""
    blocks = grid_tiles(n_tok, n_seqs, n_heads // n_kv, head_dim) * n_kv
    want = cdiv(2 * RESIDENT * sm_count, blocks)
    by_keys = cdiv(max_seq_len, MIN_KEYS_PER_SPLIT)
    by_memory = MAX_PARTIAL_BYTES // max(1, n_tok * n_heads * (head_dim + 2) * 4)
    return max(1, min(want, by_keys, by_memory, MAX_SPLITS))


def attention_prefill(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    query_start_loc: Any,
    seq_lens: Any,
    block_tables: Any,
    scale: float,
    sliding_window: int | None,
    softcap: float | None,
    num_splits: int,
    out: Any,
    sinks: Any = None,
) -> Any:
    """`out [T, n_heads, D]` (float32) for float32 `q [T, n_heads, D]` over paged caches (float16, or FP8: kv_format.py);
    any batch of sequences whose new tokens are their last ones (prefill chunks, decodes).
    `sinks` (float32 [n_heads], GPT-OSS): one more logit per head in its softmax's denominator."""
    n_tok, n_heads, head_dim = q.shape
    n_kv = k_cache.shape[2]
    if not supports(head_dim, n_heads, n_kv):
        raise ValueError(
            f"prefill attention: head_dim {head_dim} (supported {HEAD_DIMS}), {n_heads} heads "
            f"over {n_kv} KV heads"
        )
    if n_tok == 0:
        return out
    if num_splits == 1:
        _launch(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale, sliding_window, softcap, 1,
                out, out, out, None, sinks)  # fmt: skip
        return out
    part_o, part_ml = split_partials(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale,
                                     sliding_window, softcap, num_splits)  # fmt: skip
    return merge_splits(part_o, part_ml, out, sinks=sinks)


def split_partials(
    q: Any, k_cache: Any, v_cache: Any, query_start_loc: Any, seq_lens: Any, block_tables: Any, scale: float,
    sliding_window: int | None, softcap: float | None, num_splits: int, key_limit: Any = None, key_warps: bool = False,
) -> tuple[Any, Any]:  # fmt: skip
    """The unnormalised partials of `num_splits` (>= 2) KV splits, `part_o [T, H, S, D]` and their
    log2-domain (max, sum) `part_ml [T, H, S, 2]`, for merge_splits. `key_limit` (int32 [1] on the
    device, read at run time): no key at or past it is read, whatever the rows' positions. `key_warps`: on
    the key-split build (KEY_WARPS; the caller checks key_warps_fit)."""
    import cupy

    if num_splits < 2:
        raise ValueError(f"split partials need at least 2 splits, got {num_splits}")
    n_tok, n_heads, head_dim = q.shape
    part_o = cupy.empty((n_tok, n_heads, num_splits, head_dim), cupy.float32)
    part_ml = cupy.empty((n_tok, n_heads, num_splits, 2), cupy.float32)
    _launch(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale, sliding_window, softcap,
            num_splits, part_o, part_o, part_ml, key_limit, None, key_warps)  # fmt: skip
    return part_o, part_ml


def _launch(
    q: Any, k_cache: Any, v_cache: Any, query_start_loc: Any, seq_lens: Any, block_tables: Any, scale: float,
    sliding_window: int | None, softcap: float | None, num_splits: int, out: Any, part_o: Any, part_ml: Any,
    key_limit: Any, sinks: Any, key_warps: bool = False,
) -> None:  # fmt: skip
    n_tok, n_heads, head_dim = q.shape
    n_kv, block_size = k_cache.shape[2], k_cache.shape[1]
    n_seqs = seq_lens.shape[0]
    kv = kv_operands(k_cache, v_cache)
    wide = not key_warps and wide_tile(head_dim, bool(kv.defines))
    smem = shared_bytes(head_dim, wide, key_warps)
    tile = KEY_WARPS if key_warps else WIDE_TILE if wide else {}
    # PF_BS: the cache's block size built in, so the K/V loaders' divisions by it are shifts (or multiplications)
    defines = {"PF_D": head_dim, "PF_BS": block_size, **kv.defines, **tile}
    kernel = get_kernel("attention_prefill.cu", f"attn_prefill_d{head_dim}", defines)
    allow_shared(kernel, smem)
    args = (
        q, kv.k, kv.v, query_start_loc, seq_lens, block_tables, i32(block_tables.shape[1]), i32(n_seqs),
        i32(n_heads), i32(n_kv), i32(block_size), f32(scale), f32(softcap or 0.0), i32(sliding_window or 0),
        out, part_o, part_ml, ptr(key_limit), ptr(sinks), *kv.scales,
    )  # fmt: skip
    parts = head_dim // value_columns(head_dim)  # blocks per (row tile, KV head), each its value columns
    grid = (grid_tiles(n_tok, n_seqs, n_heads // n_kv, head_dim, key_warps), n_kv * parts, num_splits)
    launch(kernel, grid, (THREADS,), args, shared_mem=smem)


def merge_splits(
    part_o: Any, part_ml: Any, out: Any, extra_o: Any = None, extra_lse: Any = None, sinks: Any = None
) -> Any:
    """`out [T, H, D]` (float32, or float16: attn_prefill_merge_h) from the split partials `part_o [T, H, S, D]`,
    `part_ml [T, H, S, 2]` (and a normalised `extra_o [T, H, D]` with its natural-log sums `extra_lse [T, H]`,
    and the heads' sink logits `sinks [H]`, where given)."""
    n_tok, n_heads, num_splits, head_dim = part_o.shape
    if num_splits > MAX_SPLITS:
        raise ValueError(f"attn_prefill_merge takes at most {MAX_SPLITS} splits, got {num_splits}")
    name = "attn_prefill_merge_h" if out.dtype.itemsize == 2 else "attn_prefill_merge"
    merge = get_kernel("attention_prefill.cu", name, {"PF_D": head_dim})
    args = (part_o, part_ml, i32(num_splits), i32(head_dim), out, ptr(extra_o), ptr(extra_lse), ptr(sinks),
            i32(n_heads))  # fmt: skip
    launch(merge, (n_tok * n_heads,), (head_dim,), args)
    return out
