// Quantized matrix-vector products for decode: y[t, r] = sum_c W[r, c] * x[t, c] (+ bias[r]).
//
// W stays in its GGUF block layout. One thread block owns R consecutive rows; its warps
// split the row's 32-weight units between them and every lane decodes the same unit of
// all R rows, so each x value it loads (float4, from L1) is used R times: at one token,
// x traffic would otherwise outweigh the weight bytes. Quants enter the dot products as
// the codes of quant.cuh's raw() (no int-to-float conversions), scaled once per run. The token count is a compile-time
// bucket T (1, 2, 4, 8) with the real count n_tok <= T checked per token, so the
// accumulators stay in registers. Rows past n_rows re-read the last row and are not
// written; partial sums meet through warp shuffles and then shared memory.
#include "quant.cuh"

#define GEMV_MAX_WARPS 8

template <class Fmt, int T, int R>
__device__ __forceinline__ void gemv_body(const u8* __restrict__ w, i64 row_bytes, int n_rows, int n_cols,
                                          const float* __restrict__ x, int n_tok, float* __restrict__ y,
                                          const float* __restrict__ bias) {
    __shared__ float partial[GEMV_MAX_WARPS][T * R];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    const int row0 = blockIdx.x * R;
    const int units = n_cols >> 5;

    const u8* rows[R];
#pragma unroll
    for (int r = 0; r < R; ++r) rows[r] = w + (i64)min(row0 + r, n_rows - 1) * row_bytes;

    float acc[T][R];
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

#pragma unroll
    for (int t = 0; t < T; ++t)
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float v = warp_sum(acc[t][r]);
            if (lane == 0) partial[warp][t * R + r] = v;
        }
    __syncthreads();
    for (int i = threadIdx.x; i < T * R; i += blockDim.x) {
        const int t = i / R, r = i % R, row = row0 + r;
        if (t >= n_tok || row >= n_rows) continue;
        float s = 0.f;
        for (int ww = 0; ww < n_warps; ++ww) s += partial[ww][i];
        if (bias != nullptr) s += bias[row];
        y[(i64)t * n_rows + row] = s;
    }
}

// Kernels gemv_<format>_t<T>_r<R>: rows per block R by token bucket T (more rows reuse x more,
// more tokens need more registers); T=1 comes in two R so the benchmark can pick.
#define GEMV_KERNEL(SUFFIX, FMT, T, R)                                                                    \
    extern "C" __global__ void __launch_bounds__(256) gemv_##SUFFIX##_t##T##_r##R(                       \
        const u8* __restrict__ w, i64 row_bytes, int n_rows, int n_cols, const float* __restrict__ x,    \
        int n_tok, float* __restrict__ y, const float* __restrict__ bias) {                              \
        gemv_body<FMT, T, R>(w, row_bytes, n_rows, n_cols, x, n_tok, y, bias);                            \
    }

#define GEMV_FORMAT(SUFFIX, FMT)     \
    GEMV_KERNEL(SUFFIX, FMT, 1, 8)   \
    GEMV_KERNEL(SUFFIX, FMT, 1, 4)   \
    GEMV_KERNEL(SUFFIX, FMT, 2, 4)   \
    GEMV_KERNEL(SUFFIX, FMT, 4, 2)   \
    GEMV_KERNEL(SUFFIX, FMT, 8, 2)

// The Python wrapper compiles one format per module (-DPADDOCK_FORMAT=q4_k
// -DPADDOCK_FORMAT_STRUCT=FmtQ4_K); the compile check defines PADDOCK_ALL_VARIANTS to
// build every format at once.
#if defined(PADDOCK_ALL_VARIANTS)
PADDOCK_FORMATS(GEMV_FORMAT)
#else
GEMV_FORMAT(PADDOCK_FORMAT, PADDOCK_FORMAT_STRUCT)
#endif
