"""Wrapper of gemv_mma.cu and gemv_mma2.cu: products of 2..MAX_TOKENS tokens on quantized weights,
on tensor cores.

linear.py sends a decode step of several sequences here, instead of to the float32-x GEMVs
(compute-bound from 2 tokens), to cuBLAS on float16 copies (3.4x the bytes of a Q4_K_M file) or
to expand-then-cuBLAS, when the plan's `mma_max_tokens` allows. Two kernels, picked by `kernel`
(KernelOptions.gemv_mma_kernel, PADDOCK_GEMV_MMA_KERNEL):
- "v1", gemv_mma.cu: x read as float32 by every lane of every row tile, one 128-column step of
  weight loads in flight; ~0.9 TB/s on the H200, latency-bound (docs/tuning-log.md, 2026-12-02);
- "v2", gemv_mma2.cu: x rounded to float16 once (a pre-pass) and staged in fragment order in shared
  memory for the block's row-warps, the next step's weights in flight across the barriers, the
  cheap raw()/coef() decode, column splits across blocks where rows are few (on sm_90+ a
  thread-block cluster that adds them in rank order). gemv_mma2.cu says why;
  bench/micro/gemv_mma_times.py measures both against cuBLAS on float16 copies.
One launch serves up to three weights stacked along the output.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from app.engine.kernels.runtime.compile import MAX_CLUSTER, clusters_supported, get_kernel
from app.engine.kernels.runtime.launch import cdiv, i32, i64, launch, ptr

FORMATS = frozenset({"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"})
KERNELS = ("v1", "v2")
N_TILES = (1, 2, 4, 8)  # builds by tokens: 8 per n-tile
MAX_TOKENS = 8 * N_TILES[-1]
WARPS_TARGET = 2048  # v1: ~16 warps on each of the H200's 132 multiprocessors
MULTIPROCESSORS = 132  # v2's grid target: H100 SXM and H200 both have 132
# Without thread-block clusters, column splits add their partial sums into zeros with float atomics. Two
# splits give the same bits whichever lands first ((0 + a) + b == (0 + b) + a); more would make a
# product's last bits, and a near-tie's greedy token, vary from run to run. Decoding stays deterministic:
# at most two. On sm_90+ a row tile's splits are one cluster that adds them in rank order, so up to
# MAX_CLUSTER (on the H100 4-8 splits were up to 1.7x faster where the rows are few, e.g. a 27B down
# projection at 32 tokens 111 against 193 us with two atomic splits).
MAX_SPLITS = 2
# v2's column splits bring a product's blocks up to about this many waves of one block a multiprocessor.
# On the H100 (2026-12-07, bench/results/gpu-s28-2026-12-07.md), with each lane's next weights in flight
# while it multiplies (quant.cuh's fetch/unpack), more splits than that lost: Qwen3-8B gate+up (Q4_K,
# 24,576 x 4,096) at 8 tokens, 384 blocks, 38.1 us unsplit against 41.0 / 47.1 / 60.1 with 2 / 4 / 8; at
# 32 tokens, 192 blocks, 52.4 us with 2 against 62.6 / 63.3 / 69.9 with 1 / 4 / 8; down (Q6_K, 4,096 x
# 12,288) at 32 tokens, 32 blocks, 68.5 us with 8 against 196.6 / 104.3 / 80.1 with 1 / 2 / 4. (Before
# fetch/unpack each lane stalled on its next loads, and 8 waves had beaten one: gpu-s17-2026-12-06.md.)
WAVES = 3
X16_THREADS = 256
MAX_SHARED_BYTES = 48 * 1024  # static shared memory of one block


@dataclass(frozen=True)
class MmaShape:
    """v1: `m_tiles` a block, `warps` splitting the columns. v2: `m_tiles` a warp, `row_warps` x
    `warps` warps a block (row-warps own rows, column-warps split the columns), `k_splits` blocks
    splitting the columns of the same rows (gridDim.y)."""

    m_tiles: int  # 16-row tiles (a block in v1, a warp in v2)
    n_tiles: int  # 8-token tiles
    warps: int  # warps splitting the columns
    row_warps: int = 1  # v2 only
    k_splits: int = 1  # v2 only
    cluster: bool = False  # v2 only: the k_splits blocks of a row tile are a thread-block cluster (sm_90+)

    def rows(self) -> int:
        """Rows a block."""
        return 16 * self.m_tiles * self.row_warps

    def shared_bytes_v2(self) -> int:
        """gemv_mma2.cu's static shared memory (gm2::SMEM_WORDS): two buffers of a super-step's staged
        x, or the column-warps' sums and the block's sums for its cluster, whichever is larger; it
        asserts <= 48 KiB at compile time."""
        staged = 2 * self.warps * 4 * 8 * self.n_tiles * 4 * 16
        tile_sums = self.row_warps * self.m_tiles * self.n_tiles * 4 * 32 * 4
        sums = (self.warps - 1) * tile_sums + (tile_sums if self.clustered() else 0)
        return max(staged, sums)

    def clustered(self) -> bool:
        """Whether the column splits add up in a thread-block cluster (GM_CL), not with atomics."""
        return self.cluster and self.k_splits > 1


def serves(
    n_tok: int, qtype_names: list[str] | tuple[str, ...], n_cols: int, max_tokens: int = MAX_TOKENS
) -> bool:
    return (
        2 <= n_tok <= min(max_tokens, MAX_TOKENS)
        and n_cols % 32 == 0
        and all(q in FORMATS for q in qtype_names)
    )


def _n_tiles(n_tok: int) -> int:
    return next(n for n in N_TILES if 8 * n >= n_tok)


def pick_shape(
    n_tok: int, n_rows: int, n_cols: int, kernel: str = "v1", clusters: bool = False, max_splits: int = MAX_CLUSTER
) -> MmaShape:
    """The launch shape of `kernel` for `n_tok` tokens times `n_rows` stacked rows of `n_cols`. v2:
    `clusters` (the device has them) lets up to `max_splits` column splits add up in a cluster; without,
    at most MAX_SPLITS, with atomics."""
    if kernel == "v2":
        return _pick_shape_v2(n_tok, n_rows, n_cols, min(max_splits, MAX_CLUSTER if clusters else MAX_SPLITS), clusters)
    # v1: two m-tiles share each x load where the grid stays large; more n-tiles take one m-tile
    # (registers); warps fill the grid up to WARPS_TARGET, no more than the 128-column steps.
    n_tiles = _n_tiles(n_tok)
    m_tiles = 2 if n_tiles <= 2 and cdiv(n_rows, 32) >= 512 else 1
    tiles = cdiv(n_rows, 16 * m_tiles)
    steps = cdiv(n_cols // 32, 4)
    warps = next((w for w in (1, 2, 4, 8) if tiles * w >= WARPS_TARGET), 8)
    return MmaShape(m_tiles, n_tiles, max(1, min(warps, steps)))


def _pick_shape_v2(n_tok: int, n_rows: int, n_cols: int, max_splits: int, clusters: bool) -> MmaShape:
    """Why these numbers (per weight byte of Q4_K, 0.5625 bytes a weight):
    - m-tiles a warp: each 16-row tile reads all the staged x from shared memory, 1.8 NT / MT bytes
      per weight byte; at 4-8 n-tiles one m-tile would make shared memory, not the tensor cores,
      the limit (128 bytes a clock a multiprocessor), so two (186-249 registers, no spills at
      sm_90); at 1-2 n-tiles one keeps registers at 80-102.
    - 4 row-warps: the block stages float16 x from L2 once for 64 MT rows, 3.6 T / (64 MT) bytes per
      weight byte: <= 0.9 up to 32 tokens, 1.8 at 64 (where the tensor cores bound it anyway).
    - column-warps: 2 at 1-2 n-tiles (8-warp blocks, two or three a multiprocessor, with fewer column
      splits to pay for), 1 at 4-8: the 249-register build then fits two 4-warp blocks a
      multiprocessor, and two 64-token x buffers stay within 48 KiB of shared memory.
    - column splits: where the row tiles are few (a 4096-row q or down projection has 32-64), more
      blocks share the columns, doubling while the blocks stay within WAVES waves, up to `max_splits`,
      and while each split keeps >= 2 super-steps.
    """
    n_tiles = _n_tiles(n_tok)
    m_tiles = 1 if n_tiles <= 2 else 2
    col_warps = 2 if n_tiles <= 2 else 1
    shape = MmaShape(m_tiles, n_tiles, col_warps, row_warps=4)
    blocks = cdiv(n_rows, shape.rows())
    super_steps = cdiv(cdiv(n_cols // 32, 4), col_warps)
    splits = 1
    while 2 * splits <= max_splits and 2 * splits * blocks <= WAVES * MULTIPROCESSORS and super_steps >= 4 * splits:
        splits *= 2
    return replace(shape, k_splits=splits, cluster=clusters)


def gemv_mma(
    parts: list[tuple[Any, str, int, int]], n_cols: int, x: Any, out: Any, bias: Any | None = None,
    shape: MmaShape | None = None, kernel: str = "v1", max_splits: int = MAX_CLUSTER,
) -> Any:  # fmt: skip
    """`out = x @ [W0; W1; W2].T (+ bias)` for float32 `x [T, n_cols]`, 2 <= T <= MAX_TOKENS, and
    1 to 3 weights `(data, qtype_name, row_bytes, n_rows)`; `out` is float32 `[T, sum n_rows]`,
    contiguous. `kernel` picks gemv_mma.cu ("v1") or gemv_mma2.cu ("v2"); `max_splits` caps v2's column
    splits (GemvPlan.mma_splits); `shape` overrides the launch shape (benchmarks)."""
    if not 1 <= len(parts) <= 3:
        raise ValueError(f"gemv_mma takes 1 to 3 weights, got {len(parts)}")
    n_tok = x.shape[0]
    if not 1 <= n_tok <= MAX_TOKENS or n_cols % 32:
        raise ValueError(f"gemv_mma takes 1..{MAX_TOKENS} tokens of a multiple of 32 columns, got {x.shape}")
    unknown = {p[1] for p in parts} - FORMATS
    if unknown:
        raise ValueError(f"gemv_mma has no decoder for {sorted(unknown)}")
    if kernel not in KERNELS:
        raise ValueError(f"gemv_mma kernel must be one of {KERNELS}, not {kernel!r}")
    total_rows = sum(p[3] for p in parts)
    shape = shape or pick_shape(n_tok, total_rows, n_cols, kernel, kernel == "v2" and clusters_supported(), max_splits)
    padded = list(parts) + [(parts[-1][0], parts[-1][1], parts[-1][2], 0)] * (3 - len(parts))
    source, defines = module_of(kernel, [p[1] for p in parts], shape)
    blocks = sum(cdiv(p[3], shape.rows()) for p in padded)
    weights = (padded[0][0], padded[1][0], padded[2][0], i64(padded[0][2]), i64(padded[1][2]), i64(padded[2][2]),
               i32(padded[0][3]), i32(padded[1][3]), i32(padded[2][3]), i32(n_cols))  # fmt: skip
    if kernel == "v1":
        if shape.row_warps != 1 or shape.k_splits != 1:
            raise ValueError(f"gemv_mma v1 has no row-warps or column splits: {shape}")
        kernel_v1 = get_kernel(source, "gemv_mma", defines)
        launch(kernel_v1, (blocks,), (32 * shape.warps,), (*weights, x, i32(n_tok), out, ptr(bias)))
        return out
    if shape.shared_bytes_v2() > MAX_SHARED_BYTES:
        raise ValueError(f"gemv_mma v2 shape {shape} needs {shape.shared_bytes_v2()} bytes of shared memory")
    if shape.clustered() and shape.k_splits > MAX_CLUSTER:
        raise ValueError(f"gemv_mma v2: a cluster holds at most {MAX_CLUSTER} column splits, not {shape.k_splits}")
    _gemv_mma2(shape, source, defines, blocks, weights, x, n_tok, out, bias)
    return out


def module_of(kernel: str, qtype_names: list[str], shape: MmaShape) -> tuple[str, dict[str, str | int]]:
    """The kernel file and defines of a product of 1-3 weights of `qtype_names` (benchmarks compile them ahead)."""
    formats = [*qtype_names, *[qtype_names[-1]] * (3 - len(qtype_names))]  # absent weights take the last's
    defines: dict[str, str | int] = {f"GM_F{i}": f"Fmt{q}" for i, q in enumerate(formats)}
    defines |= {"GM_MT": shape.m_tiles, "GM_NT": shape.n_tiles}
    if kernel == "v1":
        return "gemv_mma.cu", {**defines, "GM_WARPS": shape.warps}
    defines |= {"GM_RW": shape.row_warps, "GM_KW": shape.warps}
    return "gemv_mma2.cu", {**defines, "GM_CL": shape.k_splits} if shape.clustered() else defines


def _gemv_mma2(
    shape: MmaShape, source: str, defines: dict[str, str | int], blocks: int, weights: tuple[Any, ...], x: Any,
    n_tok: int, out: Any, bias: Any | None,
) -> None:  # fmt: skip
    """The pre-pass (float16 x; zeros in `out` for atomic column splits to add into), then the product."""
    import cupy

    x16 = cupy.empty(x.shape, cupy.float16)
    zero = shape.k_splits > 1 and not shape.clustered()
    pre = get_kernel(source, "gemv_mma2_x16", defines)
    work = max(x.size // 4, out.size if zero else 0)
    pre_blocks = max(1, min(cdiv(work, X16_THREADS), 4 * MULTIPROCESSORS))  # stride loops cover the rest
    launch(pre, (pre_blocks,), (X16_THREADS,),
           (x, x16, i32(x.size), out if zero else ptr(None), i32(out.size if zero else 0)))  # fmt: skip
    main = get_kernel(source, "gemv_mma2", defines)
    launch(main, (blocks, shape.k_splits), (32 * shape.row_warps * shape.warps,),
           (*weights, x16, i32(n_tok), out, ptr(bias)))  # fmt: skip
