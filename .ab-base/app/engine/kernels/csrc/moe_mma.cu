// The routed experts' grouped products of a prefill chunk on tensor cores (kernels/moe_mma.py).
//
// Why: moe.cu's moe_grouped_<fmt> gives each (expert, weight row) one warp that walks the expert's
// pairs MOE_T at a time on CUDA cores, so an expert with 250 pairs (8,000 tokens, top 8 of 256) reads
// and decodes its weights ~60 times. Here a block owns a tile of MMA_BM of one expert's pairs times
// MMA_BN of its weight rows: each 128-column step decodes the tile's weights once into shared memory
// as float16, copies the pairs' inputs (gathered through `order`, as moe_grouped does; converted to
// float16 once before, moe_mma_half) beside them, and 8 warps multiply the two with mma.sync.m16n8k16,
// float32 accumulation. The output rows are in the grouped order (`y[g, r]`), as moe_grouped writes
// them, so moe_gated and moe_combine are the same.
//
//   moe_mma_half   the inputs as float16, each row scaled by a power of two into float16's range.
//   moe_mma_tiles  the tile list, on the device (the pair counts never reach the host): tile j is
//                  (expert, first grouped pair); tiles[0] is how many there are. The product's grid
//                  covers an upper bound (pairs / MMA_BM + experts) and the blocks past the end leave.
//   moe_mma_<fmt>  the product of one tile of pairs x MMA_BN rows (grid: row tiles, pair tiles).
//
// 128 columns a step because four consecutive 32-weight units of quant.cuh cover exactly 128 columns
// in every format (Q6_K's unit spans 80 of them: 16 weights, then 16 more 64 columns on), so a step's
// units decode into its own columns of the tile and nowhere else. Numerics as gemv_mma.cu: a weight is
// decoded in float32 and rounded once to float16, an input rounded to float16, sums in float32.
#include "mma.cuh"
#include "quant.cuh"

// The tile shape, chosen by kernels/moe_mma.py: 64 pairs x 64 rows, or 32 x 128 where experts have fewer
// pairs (less of each expert's last tile multiplies padding). 8 warps, 2 along the pairs x 4 along the
// rows; a warp's MMA_MT m16 tiles by MMA_NT n8 tiles (NT even: one ldmatrix.x4 gives two n8 tiles of B).
#ifndef MMA_BM
#define MMA_BM 64  // pairs a tile: 32 or 64
#endif
#ifndef MMA_BN
#define MMA_BN 64  // weight rows a tile: 64 or 128
#endif
#define MMA_BK 128               // columns a step
#define MMA_STRIDE (MMA_BK + 8)  // halves a shared row: 16 bytes of padding put ldmatrix's 8 rows on 8 banks
#define MMA_THREADS 256
#define MMA_MT (MMA_BM / 32)
#define MMA_NT (MMA_BN / 32)
#define MMA_WU (MMA_BN / 64)  // weight units a thread decodes a step (4 a row)
#define MMA_XJ (MMA_BM / 16)  // 16-byte pieces of the float16 inputs a thread copies a step (16 a row)
static_assert((MMA_BM == 32 || MMA_BM == 64) && (MMA_BN == 64 || MMA_BN == 128) && MMA_BM * MMA_BN <= 4096,
              "moe_mma's tile shapes: 32 or 64 pairs by 64 or 128 rows, within 48 KB of static shared memory");

// tiles[0] = the number of tiles; tiles[1 + 2j], tiles[2 + 2j] = tile j's expert and first grouped pair.
// Thread e finds its first tile by summing the tile counts of the experts before it (n_exp reads, all
// threads at once), then writes its own: no scan, one small block.
extern "C" __global__ void moe_mma_tiles(const int* __restrict__ offsets, int n_exp, int* __restrict__ tiles) {
    after_previous_grid();
    if (n_exp == 0 && threadIdx.x == 0) tiles[0] = 0;
    for (int e = threadIdx.x; e < n_exp; e += blockDim.x) {
        int start = 0;
        for (int f = 0; f < e; ++f) start += (offsets[f + 1] - offsets[f] + MMA_BM - 1) / MMA_BM;
        const int begin = offsets[e], n = (offsets[e + 1] - begin + MMA_BM - 1) / MMA_BM;
        for (int j = 0; j < n; ++j) {
            tiles[1 + 2 * (start + j)] = e;
            tiles[2 + 2 * (start + j)] = begin + j * MMA_BM;
        }
        if (e == n_exp - 1) tiles[0] = start + n;
    }
}

// out[row] = x[row] * 2^s as float16 (round to nearest), a warp a row, and inv_scale[row] = 2^-s, where s puts
// the row's largest magnitude in [2^14, 2^15): no row overflows float16 (65504) or sinks into its
// subnormals, whatever its size (squared ReLUs, large activations, random test weights). A power of two,
// so the scaling itself is exact and the product's epilogue gives back W . x as inv_scale * (W . out).
// Converted once here, not by each of the 8-32 row tiles that read a row.
extern "C" __global__ void moe_mma_half(const float* __restrict__ x, int n_rows, int n_cols, u16* __restrict__ out,
                                        float* __restrict__ inv_scale) {
    after_previous_grid();
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n_rows) return;  // the whole warp
    const float4* src = reinterpret_cast<const float4*>(x + (i64)row * n_cols);
    float m = 0.f;  // NaN is skipped by fmaxf (and stays NaN below); inf gives the smallest scale
    for (int c = lane; c < n_cols / 4; c += 32) {
        const float4 v = __ldg(src + c);
        m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
    m = warp_max(m);
    const int e = m > 0.f ? (int)((__float_as_uint(m) >> 23) & 0xffu) - 127 : 14;  // a row of zeros: scale 1
    const int s = min(max(14 - e, -126), 126);  // both 2^s and 2^-s normal floats
    const float scale = __uint_as_float((u32)(127 + s) << 23);
    uint2* dst = reinterpret_cast<uint2*>(out + (i64)row * n_cols);
    for (int c = lane; c < n_cols / 4; c += 32) {
        const float4 v = __ldg(src + c);
        dst[c] = make_uint2(pack_h2_rn(v.x * scale, v.y * scale), pack_h2_rn(v.z * scale, v.w * scale));
    }
    if (lane == 0) inv_scale[row] = __uint_as_float((u32)(127 - s) << 23);
}

// What one thread brings from global memory for one 128-column step: MMA_WU 32-weight units of the
// tile's weights (thread i: rows i / 4 + 64 j, the step's unit i % 4) and MMA_XJ 16-byte pieces of the
// float16 inputs (thread i: tile rows i / 16 + 16 j, columns 8 (i % 16)..+7, so 16 threads read a row's
// 256 contiguous bytes). Fetched a step ahead of its use: the loads are in flight while the warps
// multiply the step before.
template <class F>
struct MmaStage {
    F f[MMA_WU];
    uint4 x[MMA_XJ];
};

template <class F>
__device__ __forceinline__ void mma_fetch(MmaStage<F>& s, const u8* const* wrow, int step, int n_units,
                                          const u16* __restrict__ x, const int* xrow, int n_cols) {
    const int u = min(4 * step + (int)(threadIdx.x & 3), n_units - 1);  // a unit past the end: decoded as zeros
#pragma unroll
    for (int j = 0; j < MMA_WU; ++j) s.f[j].fetch(wrow[j], u);  // loads alone: mma_store unpacks (quant.cuh)
    const int col = MMA_BK * step + 8 * (threadIdx.x & 15);
#pragma unroll
    for (int j = 0; j < MMA_XJ; ++j) {
        const u16* p = x + (i64)xrow[j] * n_cols + col;
        s.x[j] = xrow[j] >= 0 && col < n_cols ? __ldg(reinterpret_cast<const uint4*>(p)) : make_uint4(0u, 0u, 0u, 0u);
    }
}

template <class F>
__device__ __forceinline__ void mma_store(const MmaStage<F>& s, int step, int n_units, u16 (*ws)[MMA_STRIDE],
                                          u16 (*xsh)[MMA_STRIDE]) {
    const int u = 4 * step + (int)(threadIdx.x & 3);
    const bool ok = u < n_units;  // past the row's end (32-weight formats only): zeros in the unit's 32 columns
    const int at = F::x_base(u) - MMA_BK * step;
#pragma unroll
    for (int j = 0; j < MMA_WU; ++j) {
        u16* row = ws[(threadIdx.x >> 2) + 64 * j];
        F f = s.f[j];
        f.unpack();  // the scales of what mma_fetch loaded while the previous step multiplied
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            float w0[4], w1[4];
            f.get(k, w0, w1);
            *reinterpret_cast<uint2*>(row + at + 4 * k) =
                ok ? make_uint2(pack_h2_rn(w0[0], w0[1]), pack_h2_rn(w0[2], w0[3])) : make_uint2(0u, 0u);
            *reinterpret_cast<uint2*>(row + at + F::RUN1 + 4 * k) =
                ok ? make_uint2(pack_h2_rn(w1[0], w1[1]), pack_h2_rn(w1[2], w1[3])) : make_uint2(0u, 0u);
        }
    }
#pragma unroll
    for (int j = 0; j < MMA_XJ; ++j)
        *reinterpret_cast<uint4*>(&xsh[(threadIdx.x >> 4) + 16 * j][8 * (threadIdx.x & 15)]) = s.x[j];
}

// y[g, r] = W_e[r, :] . x[src(g), :] (+ bias_e[r]) for the pairs g of tile blockIdx.y and the rows r of
// row tile blockIdx.x; src(g) = order[g] / k, or g when the inputs are per pair (`x_per_pair`); x and
// inv_scale are moe_mma_half's (float16 rows scaled by powers of two, and the inverse scales).
template <class F>
__device__ __forceinline__ void moe_mma(const u8* __restrict__ w, i64 expert_stride, i64 row_bytes, int n_rows,
                                        int n_cols, const u16* __restrict__ x, const float* __restrict__ inv_scale,
                                        int x_per_pair, const int* __restrict__ order,
                                        const int* __restrict__ offsets, const int* __restrict__ tiles, int k,
                                        const float* __restrict__ bias, float* __restrict__ y) {
    __shared__ __align__(16) u16 ws[MMA_BN][MMA_STRIDE];
    __shared__ __align__(16) u16 xsh[MMA_BM][MMA_STRIDE];
    __shared__ float pair_scale[MMA_BM];  // each pair's input row's inv_scale (read after the loop's barriers)
    after_previous_grid();
    const int tile = blockIdx.y;
    if (tile >= tiles[0]) return;  // past the device-side tile count: the grid is an upper bound
    const int e = tiles[1 + 2 * tile], g0 = tiles[2 + 2 * tile];
    const int count = min(MMA_BM, offsets[e + 1] - g0), row0 = blockIdx.x * MMA_BN;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int n_units = n_cols >> 5, n_steps = (n_units + 3) >> 2;

    const u8* wrow[MMA_WU];  // this thread's weight rows (past the last row: the last, its products unused)
#pragma unroll
    for (int j = 0; j < MMA_WU; ++j) {
        const int r = min(row0 + (int)(threadIdx.x >> 2) + 64 * j, n_rows - 1);
        wrow[j] = w + e * expert_stride + (i64)r * row_bytes;
    }
    int xrow[MMA_XJ];  // this thread's input rows (-1: past the tile's pairs, read as zeros)
#pragma unroll
    for (int j = 0; j < MMA_XJ; ++j) {
        const int m = (threadIdx.x >> 4) + 16 * j;
        xrow[j] = m < count ? (x_per_pair ? g0 + m : order[g0 + m] / k) : -1;
    }
    if (threadIdx.x < MMA_BM) {
        const int m = threadIdx.x;
        pair_scale[m] = m < count ? inv_scale[x_per_pair ? g0 + m : order[g0 + m] / k] : 0.f;
    }

    float c[MMA_MT][MMA_NT][4];  // [m16 tile][n8 tile][fragment]
#pragma unroll
    for (int mt = 0; mt < MMA_MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < MMA_NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) c[mt][nt][i] = 0.f;

    const int wm = 16 * MMA_MT * (warp >> 2), wn = 8 * MMA_NT * (warp & 3);
    MmaStage<F> stage;
    mma_fetch(stage, wrow, 0, n_units, x, xrow, n_cols);
    for (int step = 0; step < n_steps; ++step) {
        mma_store(stage, step, n_units, ws, xsh);
        __syncthreads();
        if (step + 1 < n_steps) mma_fetch(stage, wrow, step + 1, n_units, x, xrow, n_cols);  // in flight meanwhile
#pragma unroll
        for (int kk = 0; kk < MMA_BK / 16; ++kk) {
            u32 a[MMA_MT][4], b[MMA_NT / 2][4];
#pragma unroll
            for (int mt = 0; mt < MMA_MT; ++mt)
                ldsm_x4(a[mt], &xsh[wm + 16 * mt + (lane & 15)][16 * kk + 8 * (lane >> 4)]);
            // matrices: rows n..n+7 at k 0..7, at k 8..15, then rows n+8..n+15 the same: b[0..1], b[2..3]
#pragma unroll
            for (int np = 0; np < MMA_NT / 2; ++np)
                ldsm_x4(b[np], &ws[wn + 16 * np + (lane & 7) + 8 * (lane >> 4)][16 * kk + 8 * ((lane >> 3) & 1)]);
#pragma unroll
            for (int mt = 0; mt < MMA_MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < MMA_NT; ++nt) mma_16816(c[mt][nt], a[mt], b[nt >> 1] + 2 * (nt & 1));
        }
        __syncthreads();
    }

    // C fragment: c[0..1] are pair g, rows 2t and 2t + 1 of the n8 tile; c[2..3] the same for pair g + 8.
#pragma unroll
    for (int mt = 0; mt < MMA_MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int m = wm + 16 * mt + 8 * h + g;
            if (m >= count) continue;
            const float scale = pair_scale[m];
#pragma unroll
            for (int nt = 0; nt < MMA_NT; ++nt)
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    const int r = row0 + wn + 8 * nt + 2 * t + i;
                    if (r >= n_rows) continue;
                    const float add = bias != nullptr ? bias[(i64)e * n_rows + r] : 0.f;
                    y[(i64)(g0 + m) * n_rows + r] = c[mt][nt][2 * h + i] * scale + add;
                }
        }
}

#define MOE_MMA_KERNEL(SUFFIX, FMT)                                                                          \
    extern "C" __global__ void __launch_bounds__(MMA_THREADS, 2) moe_mma_##SUFFIX(                           \
        const u8* __restrict__ w, i64 expert_stride, i64 row_bytes, int n_rows, int n_cols,                  \
        const u16* __restrict__ x, const float* __restrict__ inv_scale, int x_per_pair,                      \
        const int* __restrict__ order, const int* __restrict__ offsets, const int* __restrict__ tiles, int k, \
        const float* __restrict__ bias, float* __restrict__ y) {                                             \
        moe_mma<FMT>(w, expert_stride, row_bytes, n_rows, n_cols, x, inv_scale, x_per_pair, order, offsets,  \
                     tiles, k, bias, y);                                                                     \
    }

// One level more, so that PADDOCK_FORMAT is expanded (to q4_k, ...) before `##` pastes it into the name.
#define MOE_MMA_FORMAT(SUFFIX, FMT) MOE_MMA_KERNEL(SUFFIX, FMT)

// Every format of quant.cuh (kernels/moe_mma.py's FORMATS): each has get(), and its 32-weight units tile
// a 128-column step the same way.
#define MOE_MMA_FORMATS(FORMAT) PADDOCK_FORMATS(FORMAT)

#if defined(PADDOCK_ALL_VARIANTS)
MOE_MMA_FORMATS(MOE_MMA_KERNEL)
#elif defined(PADDOCK_FORMAT)
MOE_MMA_FORMAT(PADDOCK_FORMAT, PADDOCK_FORMAT_STRUCT)
#endif
