// Quantized matrix-vector products for decode: the building blocks of gemv.cu (one weight)
// and gemv_fused.cu (several weights that share the input: q/k/v, gate/up).
//
// W stays in its GGUF block layout. One thread block owns R rows; its warps split the
// rows' 32-weight units between them and every lane decodes the same unit of all R
// rows, so each x value it loads (float4, from L1) is used R times: at one token, x
// traffic would otherwise outweigh the weight bytes. Quants enter the dot products as
// the codes of quant.cuh's raw() (no int-to-float conversions), scaled once per run. The
// token count is a compile-time bucket T (1, 2, 4, 8) with the real count n_tok <= T
// checked per token, so the accumulators stay in registers. Partial sums meet through
// warp shuffles and then shared memory.
#pragma once
#include "quant.cuh"

#define GEMV_MAX_WARPS 8

template <class A, class B>
struct same_type {
    static constexpr bool value = false;
};
template <class A>
struct same_type<A, A> {
    static constexpr bool value = true;
};

// This lane's share of `acc[t][r] = sum_c W[rows[r], c] * x[t, c]` (x rows n_cols apart).
template <class Fmt, int T, int R>
__device__ __forceinline__ void gemv_accumulate(const u8* const (&rows)[R], int n_cols, const float* __restrict__ x,
                                                int n_tok, float (&acc)[T][R]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    const int units = n_cols >> 5;
#pragma unroll
    for (int t = 0; t < T; ++t)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[t][r] = 0.f;

    for (int u = warp * 32 + lane; u < units; u += n_warps * 32) {
        Fmt f[R];
#pragma unroll
        for (int r = 0; r < R; ++r) f[r].load(rows[r], u);
        const int xb = Fmt::x_base(u);
        // Per run: sum of codes * x (p0, p1) and, for affine formats, the sum of x (X0, X1).
        float p0[T][R], p1[T][R], X0[T], X1[T];
#pragma unroll
        for (int t = 0; t < T; ++t) {
            X0[t] = X1[t] = 0.f;
#pragma unroll
            for (int r = 0; r < R; ++r) p0[t][r] = p1[t][r] = 0.f;
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            float4 xa[T], xc[T];
#pragma unroll
            for (int t = 0; t < T; ++t) {
                if (t < n_tok) {
                    const float* xt = x + (i64)t * n_cols + xb + 4 * k;
                    xa[t] = __ldg(reinterpret_cast<const float4*>(xt));
                    xc[t] = __ldg(reinterpret_cast<const float4*>(xt + Fmt::RUN1));
                } else {
                    xa[t] = make_float4(0.f, 0.f, 0.f, 0.f);
                    xc[t] = xa[t];
                }
                if (Fmt::AFFINE) {
                    X0[t] += (xa[t].x + xa[t].y) + (xa[t].z + xa[t].w);
                    X1[t] += (xc[t].x + xc[t].y) + (xc[t].z + xc[t].w);
                }
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
                float c0[4], c1[4];
                f[r].raw(k, c0, c1);
#pragma unroll
                for (int t = 0; t < T; ++t) {
                    float a = p0[t][r], b = p1[t][r];
                    a = fmaf(c0[0], xa[t].x, a);
                    a = fmaf(c0[1], xa[t].y, a);
                    a = fmaf(c0[2], xa[t].z, a);
                    a = fmaf(c0[3], xa[t].w, a);
                    b = fmaf(c1[0], xc[t].x, b);
                    b = fmaf(c1[1], xc[t].y, b);
                    b = fmaf(c1[2], xc[t].z, b);
                    b = fmaf(c1[3], xc[t].w, b);
                    p0[t][r] = a;
                    p1[t][r] = b;
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            float a0, b0, a1, b1;
            f[r].coef(a0, b0, a1, b1);
#pragma unroll
            for (int t = 0; t < T; ++t) {
                if (Fmt::AFFINE) {
                    acc[t][r] += fmaf(a0, p0[t][r], b0 * X0[t]) + fmaf(a1, p1[t][r], b1 * X1[t]);
                } else {
                    acc[t][r] += p0[t][r] + p1[t][r];
                }
            }
        }
    }
}

// Sum each lane's acc over the block into partial[0][i] (i = t * N + r), in a fixed order.
// Ends with a barrier: afterwards every thread may read partial[0][0 .. T*N).
template <int T, int N>
__device__ __forceinline__ void gemv_block_sum(float (&acc)[T][N], float (*partial)[T * N]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
#pragma unroll
    for (int t = 0; t < T; ++t)
#pragma unroll
        for (int r = 0; r < N; ++r) {
            const float v = warp_sum(acc[t][r]);
            if (lane == 0) partial[warp][t * N + r] = v;
        }
    __syncthreads();
    if (n_warps > 1) {
        for (int i = threadIdx.x; i < T * N; i += blockDim.x) {
            float s = partial[0][i];
            for (int w = 1; w < n_warps; ++w) s += partial[w][i];
            partial[0][i] = s;
        }
        __syncthreads();
    }
}

// Rows block*R .. block*R+R-1 of one weight: y[t * y_stride + row] = sum (+ bias[row]).
// Rows past n_rows re-read the last row and are not written.
template <class Fmt, int T, int R>
__device__ __forceinline__ void gemv_rows(const u8* __restrict__ w, i64 row_bytes, int n_rows, int n_cols,
                                          const float* __restrict__ x, int n_tok, float* __restrict__ y,
                                          int y_stride, const float* __restrict__ bias, int block) {
    __shared__ float partial[GEMV_MAX_WARPS][T * R];
    const int row0 = block * R;
    if ((i64)n_rows * row_bytes <= PDL_PREFETCH_MAX_WEIGHT)
        prefetch_l2_block(w + (i64)row0 * row_bytes,
                          min((i64)PDL_PREFETCH_BLOCK_BYTES, (i64)(min(row0 + R, n_rows) - row0) * row_bytes));
    after_previous_grid();
    const u8* rows[R];
#pragma unroll
    for (int r = 0; r < R; ++r) rows[r] = w + (i64)min(row0 + r, n_rows - 1) * row_bytes;
    float acc[T][R];
    gemv_accumulate<Fmt, T, R>(rows, n_cols, x, n_tok, acc);
    gemv_block_sum<T, R>(acc, partial);
    for (int i = threadIdx.x; i < T * R; i += blockDim.x) {
        const int t = i / R, r = i % R, row = row0 + r;
        if (t >= n_tok || row >= n_rows) continue;
        float s = partial[0][i];
        if (bias != nullptr) s += bias[row];
        y[(i64)t * y_stride + row] = s;
    }
}

// rows[r] and rows[RH + r]: row row0 + r of gate (A) and of up (B), past the end clamped to the last.
template <int RH>
__device__ __forceinline__ void gated_row_pointers(const u8* wa, const u8* wb, i64 row_bytes_a, i64 row_bytes_b,
                                                   int row0, int n_rows, const u8* (&rows)[2 * RH]) {
#pragma unroll
    for (int r = 0; r < RH; ++r) {
        const i64 row = min(row0 + r, n_rows - 1);
        rows[r] = wa + row * row_bytes_a;
        rows[RH + r] = wb + row * row_bytes_b;
    }
}

// Rows block*RH .. of gate (A) and up (B): y[t * n_rows + row] = act(gate . x) * (up . x).
// With one format for both, the 2*RH rows share every x load.
template <class FA, class FB, int T, int RH, int ACT>
__device__ __forceinline__ void gemv_gated_rows(const u8* __restrict__ wa, const u8* __restrict__ wb,
                                                i64 row_bytes_a, i64 row_bytes_b, int n_rows, int n_cols,
                                                const float* __restrict__ x, int n_tok, float* __restrict__ y,
                                                int block) {
    __shared__ float partial[GEMV_MAX_WARPS][T * 2 * RH];
    const int row0 = block * RH;
    const i64 span = min(row0 + RH, n_rows) - row0, half = PDL_PREFETCH_BLOCK_BYTES / 2;
    if ((i64)n_rows * (row_bytes_a + row_bytes_b) <= PDL_PREFETCH_MAX_WEIGHT) {
        prefetch_l2_block(wa + (i64)row0 * row_bytes_a, min(half, span * row_bytes_a));
        prefetch_l2_block(wb + (i64)row0 * row_bytes_b, min(half, span * row_bytes_b));
    }
    after_previous_grid();
    float acc[T][2 * RH];
    const u8* rows[2 * RH];
    gated_row_pointers<RH>(wa, wb, row_bytes_a, row_bytes_b, row0, n_rows, rows);
    if constexpr (same_type<FA, FB>::value) {
        gemv_accumulate<FA, T, 2 * RH>(rows, n_cols, x, n_tok, acc);
    } else {
        const u8* rows_a[RH];
        const u8* rows_b[RH];
#pragma unroll
        for (int r = 0; r < RH; ++r) {
            rows_a[r] = rows[r];
            rows_b[r] = rows[RH + r];
        }
        float acc_a[T][RH], acc_b[T][RH];
        gemv_accumulate<FA, T, RH>(rows_a, n_cols, x, n_tok, acc_a);
        gemv_accumulate<FB, T, RH>(rows_b, n_cols, x, n_tok, acc_b);
#pragma unroll
        for (int t = 0; t < T; ++t)
#pragma unroll
            for (int r = 0; r < RH; ++r) {
                acc[t][r] = acc_a[t][r];
                acc[t][RH + r] = acc_b[t][r];
            }
    }
    gemv_block_sum<T, 2 * RH>(acc, partial);
    for (int i = threadIdx.x; i < T * RH; i += blockDim.x) {
        const int t = i / RH, r = i % RH, row = row0 + r;
        if (t >= n_tok || row >= n_rows) continue;
        const float g = partial[0][t * 2 * RH + r], u = partial[0][t * 2 * RH + RH + r];
        y[(i64)t * n_rows + row] = gated_act<ACT>(g, u);
    }
}

// Up to three weights stacked along the output (see gemv_fused.cu): block b belongs to the
// weight whose range of blocks holds it; the branch is uniform over the block, so the
// barriers inside stay safe. rows2 = 0 leaves two weights.
template <class F0, int R0, class F1, int R1, class F2, int R2, int T>
__device__ __forceinline__ void gemv_multi_body(const u8* __restrict__ w0, const u8* __restrict__ w1,
                                                const u8* __restrict__ w2, i64 row_bytes0, i64 row_bytes1,
                                                i64 row_bytes2, int rows0, int rows1, int rows2, int n_cols,
                                                const float* __restrict__ x, int n_tok, float* __restrict__ y,
                                                const float* __restrict__ bias) {
    const int stride = rows0 + rows1 + rows2;
    const int blocks0 = (rows0 + R0 - 1) / R0, blocks1 = (rows1 + R1 - 1) / R1;
    const int b = blockIdx.x;
    if (b < blocks0) {
        gemv_rows<F0, T, R0>(w0, row_bytes0, rows0, n_cols, x, n_tok, y, stride, bias, b);
    } else if (b < blocks0 + blocks1) {
        gemv_rows<F1, T, R1>(w1, row_bytes1, rows1, n_cols, x, n_tok, y + rows0, stride,
                             bias == nullptr ? nullptr : bias + rows0, b - blocks0);
    } else {
        gemv_rows<F2, T, R2>(w2, row_bytes2, rows2, n_cols, x, n_tok, y + rows0 + rows1, stride,
                             bias == nullptr ? nullptr : bias + rows0 + rows1, b - blocks0 - blocks1);
    }
}
