// Single-token GEMV over int16-quantized x (bodies and the reasoning in gemv_int.cuh): one
// weight (gemv_int), up to three weights stacked along the output (gemv_int_multi, q/k/v) and
// gate/up with the activation (gemv_int_gated). Formats, rows per warp and units per lane step are compile-time
// (-D, one module per combination, see gemv.py); the compile check builds the defaults.
// Dynamic shared memory: xq_shared_bytes(n_cols) per layout. The last four arguments fuse the
// add + RMSNorm before the product (XqNorm in gemv_int.cuh; norm_w null: none).
#include "gemv_int.cuh"

// Blocks of XQ_THREADS threads ptxas must fit on a multiprocessor: at 2 blocks of 256 a thread gets
// at most 128 registers (gemv_int.py sets both per build from the tuning tables). Left free, the
// Q6_K single-weight build took 143 (one block, 8 warps per SM) and the wide q/k/v one 112; capped,
// none spills but the narrow q/k/v (32 bytes). The GEMVs are latency-bound at low occupancy, so
// the cap pays (docs/tuning-log.md).
#ifndef XQ_MIN_BLOCKS
#define XQ_MIN_BLOCKS 2
#endif
// Threads per block (32 x the launch shape's warps): the launch must not exceed it.
#ifndef XQ_THREADS
#define XQ_THREADS 256
#endif

#ifndef XQ_F0
#define XQ_F0 FmtQ4_K
#define XQ_F1 FmtQ4_K
#define XQ_F2 FmtQ6_K
#define XQ_R 2
#define XQ_U 2
#define XQ_ACT 0
#endif

extern "C" __global__ void __launch_bounds__(XQ_THREADS, XQ_MIN_BLOCKS)
    gemv_int(const u8* __restrict__ w, i64 row_bytes, int n_rows, int n_cols, const float* __restrict__ x,
            float* __restrict__ y, const float* __restrict__ bias, const float* __restrict__ res,
            const float* __restrict__ norm_w, float* __restrict__ new_res, float eps) {
    extern __shared__ __align__(16) u8 xq_smem[];
    const XqNorm nrm{res, norm_w, new_res, eps};
    xq_gemv_body<XQ_F0, XQ_R, XQ_U>(w, row_bytes, n_rows, n_cols, x, y, bias, nrm, xq_smem);
}

extern "C" __global__ void __launch_bounds__(XQ_THREADS, XQ_MIN_BLOCKS)
    gemv_int_multi(const u8* __restrict__ w0, const u8* __restrict__ w1, const u8* __restrict__ w2, i64 row_bytes0,
                  i64 row_bytes1, i64 row_bytes2, int rows0, int rows1, int rows2, int n_cols,
                  const float* __restrict__ x, float* __restrict__ y, const float* __restrict__ bias,
                  const float* __restrict__ res, const float* __restrict__ norm_w, float* __restrict__ new_res,
                  float eps) {
    extern __shared__ __align__(16) u8 xq_smem[];
    const XqNorm nrm{res, norm_w, new_res, eps};
    xq_multi_body<XQ_F0, XQ_F1, XQ_F2, XQ_R, XQ_U>(w0, w1, w2, row_bytes0, row_bytes1, row_bytes2, rows0, rows1, rows2,
                                                   n_cols, x, y, bias, nrm, xq_smem);
}

extern "C" __global__ void __launch_bounds__(XQ_THREADS, XQ_MIN_BLOCKS)
    gemv_int_gated(const u8* __restrict__ wa, const u8* __restrict__ wb, i64 row_bytes_a, i64 row_bytes_b,
                  int n_rows, int n_cols, const float* __restrict__ x, float* __restrict__ y,
                  const float* __restrict__ res, const float* __restrict__ norm_w, float* __restrict__ new_res,
                  float eps) {
    extern __shared__ __align__(16) u8 xq_smem[];
    const XqNorm nrm{res, norm_w, new_res, eps};
    xq_gated_body<XQ_F0, XQ_F1, XQ_R, XQ_U, XQ_ACT>(wa, wb, row_bytes_a, row_bytes_b, n_rows, n_cols, x, y, nrm,
                                                    xq_smem);
}
