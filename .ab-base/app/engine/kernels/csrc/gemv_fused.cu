// GEMV over several weights that multiply the same input, in one launch.
//
// gemv_multi: up to three weights (q, k, v) stacked along the output: block b belongs to
// the weight whose range of blocks holds it, and each weight keeps its own format and
// rows per block (a Q4_K_M file mixes Q4_K q/k with a Q6_K v). Output row stride is the
// total row count, so y is the concatenation [T, rows0 + rows1 + rows2]; `bias` (null,
// or one vector over the total rows) is added per row.
//
// gemv_gated: gate and up together, writing act(gate . x) * (up . x): each block owns
// the same RH rows of both weights, so the activation is applied in the epilogue and the
// two [T, rows] intermediates never reach memory.
//
// The formats, rows per block and token bucket are compile-time (-D, one module per
// combination, see gemv.py); the compile check builds the defaults below.
#include "gemv.cuh"

#ifndef MULTI_F0
#define MULTI_F0 FmtQ4_K
#define MULTI_F1 FmtQ4_K
#define MULTI_F2 FmtQ6_K
#define MULTI_R0 4
#define MULTI_R1 4
#define MULTI_R2 8
#define MULTI_T 1
#endif

#ifndef GATED_FA
#define GATED_FA FmtQ4_K
#define GATED_FB FmtQ4_K
#define GATED_RH 2
#define GATED_T 1
#define GATED_ACT 0
#endif

extern "C" __global__ void __launch_bounds__(256) gemv_multi(
    const u8* __restrict__ w0, const u8* __restrict__ w1, const u8* __restrict__ w2, i64 row_bytes0,
    i64 row_bytes1, i64 row_bytes2, int rows0, int rows1, int rows2, int n_cols, const float* __restrict__ x,
    int n_tok, float* __restrict__ y, const float* __restrict__ bias) {
    gemv_multi_body<MULTI_F0, MULTI_R0, MULTI_F1, MULTI_R1, MULTI_F2, MULTI_R2, MULTI_T>(
        w0, w1, w2, row_bytes0, row_bytes1, row_bytes2, rows0, rows1, rows2, n_cols, x, n_tok, y, bias);
}

extern "C" __global__ void __launch_bounds__(256) gemv_gated(const u8* __restrict__ wa, const u8* __restrict__ wb,
                                                             i64 row_bytes_a, i64 row_bytes_b, int n_rows,
                                                             int n_cols, const float* __restrict__ x, int n_tok,
                                                             float* __restrict__ y) {
    gemv_gated_rows<GATED_FA, GATED_FB, GATED_T, GATED_RH, GATED_ACT>(wa, wb, row_bytes_a, row_bytes_b, n_rows,
                                                                      n_cols, x, n_tok, y, blockIdx.x);
}
