// Products of a few tokens (2..64) on quantized weights, through the tensor cores.
//
// Why: a decode step of 2-64 sequences multiplies a handful of rows of x by every weight. The
// float32-x GEMVs (gemv.cu) turn compute-bound there (a dequantize and an FMA per weight per
// token), and cuBLAS on the float16 copies reads 3.4x the bytes of a Q4_K_M file (16 GB against
// 4.67 GB per step at Qwen3-8B). Here each weight is decoded once into float16 registers and
// multiplied by up to 64 tokens with mma.sync.m16n8k16, so the step reads the quantized bytes
// once and the tensor cores make the per-token work free.
//
// The k-permutation: a dot product does not care in which order its columns are summed, so
// the 16 "k" slots of one mma need not be 16 consecutive columns, only the same columns in A and
// B. Lane (g, t) (g = lane / 4, t = lane % 4) holds A's k slots {2t, 2t+1, 2t+8, 2t+9} for rows
// g and g + 8, and B's same k slots for token g (mma.cuh). We give the four lanes of a quad four
// consecutive 32-weight units of the same rows (the format's natural slices, quant.cuh): lane t
// decodes unit 4s + t, and its four k slots of k-step (run r, k) are that unit's weights 4k..4k+3
// of run r, which is exactly what get(k) returns; B takes x at the same four columns, one
// float4 load. Four units (128 columns) are thus eight k-steps, and each lane decodes each weight
// once for all the tokens of the step.
//
// Work split: a block owns 16 * MT rows (MT m-tiles) and its WARPS warps take interleaved
// 128-column steps of them; partial tiles meet in shared memory at the end. NT n-tiles of 8
// tokens each share the decoded A fragments. Up to three weights stacked along the output
// (q/k/v, gate/up) are one launch: the grid's first tiles belong to the first weight, and so on.
//
// Numerics: a weight is decoded in float32 (as the dequantizers do) and rounded once to
// float16, x is rounded to float16, products accumulate in float32: the same numbers as cuBLAS
// on the float16 copy of the weight, which this path replaces.
//
// gemv_mma2.cu is the second kernel of these products (x rounded to float16 once and staged in
// shared memory, weights in flight across steps, a cheaper decode, column splits); this one stays
// for A/B runs (PADDOCK_GEMV_MMA_KERNEL=v1|v2, gemv_mma.py).
#include "gemv_mma.cuh"
#include "mma.cuh"
#include "quant.cuh"

#ifndef GM_F0
#define GM_F0 FmtQ4_K
#define GM_F1 FmtQ4_K
#define GM_F2 FmtQ6_K
#endif
#ifndef GM_MT
#define GM_MT 2  // m-tiles of 16 rows a block
#endif
#ifndef GM_NT
#define GM_NT 1  // n-tiles of 8 tokens
#endif
#ifndef GM_WARPS
#define GM_WARPS 4  // warps splitting the columns
#endif

// One block's rows [row0, row0 + 16 MT) of weight `w` times every token of x, into y's columns
// col0 + row (bias, when given, indexed the same way). `partial`: shared memory for the other
// warps' tiles, (WARPS - 1) * MT * NT * 4 * 32 floats (one buffer for every weight's format:
// a __shared__ array here would be one per instantiation).
template <class F, int MT, int NT, int WARPS>
__device__ __forceinline__ void gm_tile(const u8* __restrict__ w, i64 row_bytes, int n_rows, int row0, int n_cols,
                                        const float* __restrict__ x, int n_tok, float* __restrict__ y, int ld_y,
                                        int col0, const float* __restrict__ bias, float* partial) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int n_units = n_cols >> 5, n_steps = (n_units + 3) >> 2;

    const u8* row_p[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) row_p[mt][h] = w + (i64)min(row0 + 16 * mt + 8 * h + g, n_rows - 1) * row_bytes;
    const float* x_row[NT];
    bool tok_ok[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const int n = 8 * nt + g;
        tok_ok[nt] = n < n_tok;
        x_row[nt] = x + (i64)min(n, n_tok - 1) * n_cols;
    }

    float c[MT][NT][4];
    zero_tiles(c);

#pragma unroll 2
    for (int step = warp; step < n_steps; step += WARPS) {
        const int u = 4 * step + t;
        const bool unit_ok = u < n_units;  // past the row's end: x reads as zero, so the unit adds nothing
        const int uu = unit_ok ? u : n_units - 1;
        F f[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) f[mt][h].load(row_p[mt][h], uu);
        const int xb = F::x_base(uu);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            u32 b[NT][2][2];  // [n-tile][run]: x at the lane's four columns, as two f16x2 words
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
                    if (unit_ok && tok_ok[nt])
                        v = __ldg(reinterpret_cast<const float4*>(x_row[nt] + xb + r * F::RUN1 + 4 * k));
                    b[nt][r][0] = pack_h2_rn(v.x, v.y);
                    b[nt][r][1] = pack_h2_rn(v.z, v.w);
                }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                float lo0[4], lo1[4], hi0[4], hi1[4];  // rows g and g + 8; runs 0 and 1
                f[mt][0].get(k, lo0, lo1);
                f[mt][1].get(k, hi0, hi1);
                const u32 a0[4] = {pack_h2_rn(lo0[0], lo0[1]), pack_h2_rn(hi0[0], hi0[1]), pack_h2_rn(lo0[2], lo0[3]),
                                   pack_h2_rn(hi0[2], hi0[3])};
                const u32 a1[4] = {pack_h2_rn(lo1[0], lo1[1]), pack_h2_rn(hi1[0], hi1[1]), pack_h2_rn(lo1[2], lo1[3]),
                                   pack_h2_rn(hi1[2], hi1[3])};
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    mma_16816(c[mt][nt], a0, b[nt][0]);
                    mma_16816(c[mt][nt], a1, b[nt][1]);
                }
            }
        }
    }

    if (!gm_sum_column_warps<MT, NT, WARPS>(c, partial, warp, 0, 1, lane)) return;
    gm_write<MT, NT>(c, row0, n_rows, n_tok, y, ld_y, col0, bias, false, lane);
}

// `y[n, :] = x[n] @ [W0; W1; W2].T (+ bias)` for n < n_tok <= 8 NT; a weight with 0 rows is absent.
// One block per 16 MT rows of each weight, GM_WARPS warps a block.
extern "C" __global__ void __launch_bounds__(32 * GM_WARPS)
    gemv_mma(const u8* __restrict__ w0, const u8* __restrict__ w1, const u8* __restrict__ w2, i64 row_bytes0,
             i64 row_bytes1, i64 row_bytes2, int rows0, int rows1, int rows2, int n_cols, const float* __restrict__ x,
             int n_tok, float* __restrict__ y, const float* __restrict__ bias) {
    __shared__ float partial[(GM_WARPS > 1 ? GM_WARPS - 1 : 1) * GM_MT * GM_NT * 4 * 32];
    after_previous_grid();
    constexpr int ROWS = 16 * GM_MT;
    const int tiles0 = (rows0 + ROWS - 1) / ROWS, tiles1 = (rows1 + ROWS - 1) / ROWS;
    const int ld_y = rows0 + rows1 + rows2;
    int tile = blockIdx.x;
    if (tile < tiles0) {
        gm_tile<GM_F0, GM_MT, GM_NT, GM_WARPS>(w0, row_bytes0, rows0, tile * ROWS, n_cols, x, n_tok, y, ld_y, 0, bias, partial);
        return;
    }
    tile -= tiles0;
    if (tile < tiles1) {
        gm_tile<GM_F1, GM_MT, GM_NT, GM_WARPS>(w1, row_bytes1, rows1, tile * ROWS, n_cols, x, n_tok, y, ld_y, rows0,
                                               bias, partial);
        return;
    }
    tile -= tiles1;
    gm_tile<GM_F2, GM_MT, GM_NT, GM_WARPS>(w2, row_bytes2, rows2, tile * ROWS, n_cols, x, n_tok, y, ld_y,
                                           rows0 + rows1, bias, partial);
}
