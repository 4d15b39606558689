// Block-wide reduction and RMSNorm helpers shared by the norm kernels (norm.cu, rope_cache.cu)
// and the GEMVs that normalize their input (gemv_int.cuh).
#pragma once
#include "common.cuh"

// Sum of v over the block (every thread gets it); `scratch` holds 32 floats of shared
// memory. Call at most once per kernel: a second call could overwrite scratch before
// every thread has read the first total.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float total = 0.f;
    for (int i = 0; i < n_warps; ++i) total += scratch[i];
    return total;
}

// Sum of squares of a float4's elements, added to ss.
__device__ __forceinline__ float sum_squares(float4 v, float ss) {
    return fmaf(v.w, v.w, fmaf(v.z, v.z, fmaf(v.y, v.y, fmaf(v.x, v.x, ss))));
}

// RMSNorm's output for four values: v * inv * w, in that order (as the numpy backend).
__device__ __forceinline__ float4 norm_scale(float4 v, float inv, float4 w) {
    return make_float4(v.x * inv * w.x, v.y * inv * w.y, v.z * inv * w.z, v.w * inv * w.w);
}
