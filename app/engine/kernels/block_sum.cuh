// Block-wide reduction shared by the norm kernels (norm.cu, rope_cache.cu).
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
