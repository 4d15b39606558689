// RMSNorm over the last axis, alone or fused with the residual add before it.
//
// One thread block per row; the sum of squares is reduced in float32 through warp
// shuffles and shared memory. The fused form writes the new residual and re-reads it
// (each thread only its own elements, so no barrier is needed between the passes).
#include "block_sum.cuh"

extern "C" __global__ void __launch_bounds__(1024) rms_norm(const float* __restrict__ x, const float* __restrict__ w,
                                                            float* __restrict__ y, int n_cols, float eps) {
    after_previous_grid();
    __shared__ float scratch[32];
    const i64 base = (i64)blockIdx.x * n_cols;
    float ss = 0.f;
    for (int c = threadIdx.x; c < n_cols; c += blockDim.x) {
        const float v = x[base + c];
        ss = fmaf(v, v, ss);
    }
    const float inv = 1.f / sqrtf(block_sum(ss, scratch) / (float)n_cols + eps);
    for (int c = threadIdx.x; c < n_cols; c += blockDim.x) y[base + c] = x[base + c] * inv * w[c];
}

extern "C" __global__ void __launch_bounds__(1024) add_rms_norm(const float* __restrict__ x,
                                                                const float* __restrict__ residual,
                                                                const float* __restrict__ w, float* __restrict__ y,
                                                                float* __restrict__ new_residual, int n_cols,
                                                                float eps) {
    after_previous_grid();
    __shared__ float scratch[32];
    const i64 base = (i64)blockIdx.x * n_cols;
    float ss = 0.f;
    for (int c = threadIdx.x; c < n_cols; c += blockDim.x) {
        const float v = residual[base + c] + x[base + c];
        new_residual[base + c] = v;
        ss = fmaf(v, v, ss);
    }
    const float inv = 1.f / sqrtf(block_sum(ss, scratch) / (float)n_cols + eps);
    for (int c = threadIdx.x; c < n_cols; c += blockDim.x) y[base + c] = new_residual[base + c] * inv * w[c];
}

// The same two kernels for rows of a multiple of 4 columns, up to 4 * NORM_VEC * 1024: each
// thread loads its NORM_VEC float4s of x (and residual) at once and keeps them in registers,
// so the loads are all in flight together and nothing is re-read. At one decode token a row
// is one block: the old element-at-a-time form spent ~4 us on a 4096-wide row.
#define NORM_VEC 4

// ADD: v = residual + x, also written to new_residual; else v = x. The norm's weight is loaded
// before the wait for the previous kernel (PDL, common.cuh: no kernel writes it), so after the
// wait only x (and the residual) are a round trip away. HALF: y is float16 (rounded to nearest even,
// as a cast would), the input of a product on the weights' float16 copy (the *_vec_h kernels).
// JOIN: y = (norm + join) * join_scale[0] (no scale: nullptr), a normalised sublayer output joining the
// residual stream (Gemma's post-norms, rms_norm_join_vec), in the order and roundings of the separate add
// and multiply it replaces.
// w2 / y2 (not nullptr): a second output of the same row under another weight, y2 = x * rstd * w2 (Gemma 4's
// router reads the stream normalised without a scale, its experts with one: rms_norm_pair_vec).
template <bool ADD, bool HALF = false, bool JOIN = false>
__device__ __forceinline__ void rms_norm_vec_body(const float* __restrict__ x, const float* __restrict__ residual,
                                                  const float* __restrict__ w, void* __restrict__ y,
                                                  float* __restrict__ new_residual, int n_cols, float eps,
                                                  const float* __restrict__ join = nullptr,
                                                  const float* __restrict__ join_scale = nullptr,
                                                  const float* __restrict__ w2 = nullptr, float* __restrict__ y2 = nullptr) {
    __shared__ float scratch[32];
    const i64 base = (i64)blockIdx.x * n_cols;
    const int n4 = n_cols >> 2;
    const float4* x4 = reinterpret_cast<const float4*>(x + base);
    float4 wv[NORM_VEC];
#pragma unroll
    for (int k = 0; k < NORM_VEC; ++k) {
        const int c = threadIdx.x + k * blockDim.x;
        wv[k] = c < n4 ? __ldg(reinterpret_cast<const float4*>(w) + c) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    const float scale = JOIN && join_scale != nullptr ? __ldg(join_scale) : 1.f;  // a weight, as w
    after_previous_grid();
    float4 v[NORM_VEC];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < NORM_VEC; ++k) {
        const int c = threadIdx.x + k * blockDim.x;
        v[k] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (c < n4) {
            v[k] = __ldg(x4 + c);
            if (ADD) {
                const float4 r = __ldg(reinterpret_cast<const float4*>(residual + base) + c);
                v[k] = make_float4(r.x + v[k].x, r.y + v[k].y, r.z + v[k].z, r.w + v[k].w);
            }
        }
        ss = sum_squares(v[k], ss);
    }
    const float inv = 1.f / sqrtf(block_sum(ss, scratch) / (float)n_cols + eps);
#pragma unroll
    for (int k = 0; k < NORM_VEC; ++k) {
        const int c = threadIdx.x + k * blockDim.x;
        if (c >= n4) continue;
        if (ADD) reinterpret_cast<float4*>(new_residual + base)[c] = v[k];
        if (y2 != nullptr)
            reinterpret_cast<float4*>(y2 + base)[c] = norm_scale(v[k], inv, __ldg(reinterpret_cast<const float4*>(w2) + c));
        float4 o = norm_scale(v[k], inv, wv[k]);
        if (JOIN) {
            const float4 a = __ldg(reinterpret_cast<const float4*>(join + base) + c);
            // add, then multiply: no pair of them can contract into an FMA (that is a multiply, then an add)
            o = make_float4((o.x + a.x) * scale, (o.y + a.y) * scale, (o.z + a.z) * scale, (o.w + a.w) * scale);
        }
        if (HALF)
            reinterpret_cast<uint2*>(reinterpret_cast<u16*>(y) + base)[c] =
                make_uint2((u32)f2h(o.x) | ((u32)f2h(o.y) << 16), (u32)f2h(o.z) | ((u32)f2h(o.w) << 16));
        else
            reinterpret_cast<float4*>(reinterpret_cast<float*>(y) + base)[c] = o;
    }
}

extern "C" __global__ void __launch_bounds__(1024) rms_norm_vec(const float* __restrict__ x, const float* __restrict__ w,
                                                                float* __restrict__ y, int n_cols, float eps) {
    rms_norm_vec_body<false>(x, nullptr, w, y, nullptr, n_cols, eps);
}

extern "C" __global__ void __launch_bounds__(1024) add_rms_norm_vec(const float* __restrict__ x,
                                                                    const float* __restrict__ residual,
                                                                    const float* __restrict__ w, float* __restrict__ y,
                                                                    float* __restrict__ new_residual, int n_cols,
                                                                    float eps) {
    rms_norm_vec_body<true>(x, residual, w, y, new_residual, n_cols, eps);
}

extern "C" __global__ void __launch_bounds__(1024) rms_norm_vec_h(const float* __restrict__ x, const float* __restrict__ w,
                                                                  u16* __restrict__ y, int n_cols, float eps) {
    rms_norm_vec_body<false, true>(x, nullptr, w, y, nullptr, n_cols, eps);
}

extern "C" __global__ void __launch_bounds__(1024) add_rms_norm_vec_h(const float* __restrict__ x,
                                                                      const float* __restrict__ residual,
                                                                      const float* __restrict__ w, u16* __restrict__ y,
                                                                      float* __restrict__ new_residual, int n_cols,
                                                                      float eps) {
    rms_norm_vec_body<true, true>(x, residual, w, y, new_residual, n_cols, eps);
}

extern "C" __global__ void __launch_bounds__(1024) rms_norm_join_vec(const float* __restrict__ x,
                                                                     const float* __restrict__ w,
                                                                     const float* __restrict__ join,
                                                                     const float* __restrict__ join_scale,
                                                                     float* __restrict__ y, int n_cols, float eps) {
    rms_norm_vec_body<false, false, true>(x, nullptr, w, y, nullptr, n_cols, eps, join, join_scale);
}

extern "C" __global__ void __launch_bounds__(1024) rms_norm_pair_vec(const float* __restrict__ x,
                                                                     const float* __restrict__ w,
                                                                     const float* __restrict__ w2,
                                                                     float* __restrict__ y, float* __restrict__ y2,
                                                                     int n_cols, float eps) {
    rms_norm_vec_body<false>(x, nullptr, w, y, nullptr, n_cols, eps, nullptr, nullptr, w2, y2);
}

// RMSNorm in place over the heads of each token row: head r of token t is n_cols floats at offset +
// t * token_stride + r * n_cols (Gemma 4's value heads inside the fused q/k/v product, normalised where they
// lie instead of copied out and back: three launches fewer a layer). Each thread holds its float4s in
// registers from the load to the store, so reading and writing one buffer is safe. Grid: tokens x heads.
extern "C" __global__ void __launch_bounds__(1024) rms_norm_heads_vec(float* x, const float* __restrict__ w, int n_cols,
                                                                      float eps, int heads, i64 token_stride,
                                                                      i64 offset) {
    __shared__ float scratch[32];
    const i64 base = offset + (i64)(blockIdx.x / heads) * token_stride + (i64)(blockIdx.x % heads) * n_cols;
    const int n4 = n_cols >> 2;
    float4* x4 = reinterpret_cast<float4*>(x + base);
    float4 wv[NORM_VEC], v[NORM_VEC];
#pragma unroll
    for (int k = 0; k < NORM_VEC; ++k) {
        const int c = threadIdx.x + k * blockDim.x;
        wv[k] = c < n4 ? __ldg(reinterpret_cast<const float4*>(w) + c) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    after_previous_grid();
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < NORM_VEC; ++k) {
        const int c = threadIdx.x + k * blockDim.x;
        v[k] = c < n4 ? x4[c] : make_float4(0.f, 0.f, 0.f, 0.f);
        ss = sum_squares(v[k], ss);
    }
    const float inv = 1.f / sqrtf(block_sum(ss, scratch) / (float)n_cols + eps);
#pragma unroll
    for (int k = 0; k < NORM_VEC; ++k) {
        const int c = threadIdx.x + k * blockDim.x;
        if (c < n4) x4[c] = norm_scale(v[k], inv, wv[k]);
    }
}
