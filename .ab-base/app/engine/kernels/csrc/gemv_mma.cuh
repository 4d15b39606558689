// The ends of gemv_mma.cu's and gemv_mma2.cu's tiles: the column-warps' partial sums added up
// through shared memory, and the C fragments written to y.
#pragma once
#include "common.cuh"

// Warps that split the columns of the same rows add up their tiles: warp (kw > 0, slot) leaves its
// c in `part` ((KW - 1) * slots * MT * NT * 128 floats), warp (0, slot) adds them to its own. Returns
// false for the warps whose sums were taken (they have nothing left to write). Every thread of the
// block calls it; `part` may alias what the block read before (a barrier comes first).
template <int MT, int NT, int KW>
__device__ __forceinline__ bool gm_sum_column_warps(float (&c)[MT][NT][4], float* part, int kw, int slot, int slots,
                                                    int lane) {
    if (KW == 1) return true;
    constexpr int PER_WARP = MT * NT * 4 * 32;
    __syncthreads();
    if (kw > 0) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    part[((kw - 1) * slots + slot) * PER_WARP + ((mt * NT + nt) * 4 + e) * 32 + lane] = c[mt][nt][e];
    }
    __syncthreads();
    if (kw > 0) return false;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                for (int v = 1; v < KW; ++v)
                    c[mt][nt][e] += part[((v - 1) * slots + slot) * PER_WARP + ((mt * NT + nt) * 4 + e) * 32 + lane];
    return true;
}

// The warp's MT m-tiles (rows row0 + 16 mt + 8 h + g) times NT n-tiles of tokens into y's columns
// col0 + row (bias, when given, indexed the same way), stored, or added with atomics (`add`: column
// splits summing into a zeroed y). C fragment: c[0..1] are row g, tokens 2t and 2t + 1 of the tile;
// c[2..3] the same for row g + 8.
template <int MT, int NT>
__device__ __forceinline__ void gm_write(const float (&c)[MT][NT][4], int row0, int n_rows, int n_tok,
                                         float* __restrict__ y, int ld_y, int col0, const float* __restrict__ bias,
                                         bool add, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row0 + 16 * mt + 8 * h + g;
            if (row >= n_rows) continue;
            const float b = bias != nullptr ? bias[col0 + row] : 0.f;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int n = 8 * nt + 2 * t + e;
                    if (n >= n_tok) continue;
                    float* out = y + (i64)n * ld_y + col0 + row;
                    if (add)
                        atomicAdd(out, c[mt][nt][2 * h + e] + b);
                    else
                        *out = c[mt][nt][2 * h + e] + b;
                }
        }
}
