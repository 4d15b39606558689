// RMSNorm over the last axis, alone or fused with the residual add before it.
//
// One thread block per row; the sum of squares is reduced in float32 through warp
// shuffles and shared memory. The fused form writes the new residual and re-reads it
// (each thread only its own elements, so no barrier is needed between the passes).
#include "block_sum.cuh"

extern "C" __global__ void __launch_bounds__(1024) rms_norm(const float* __restrict__ x, const float* __restrict__ w,
                                                            float* __restrict__ y, int n_cols, float eps) {
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
