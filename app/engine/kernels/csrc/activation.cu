// Elementwise activations: gated (act(gate) * up) and the logit soft cap.
//
// Accurate expf/tanhf rather than the fast intrinsics: these feed a float32 parity
// test against numpy, and the kernels are bound by memory, not arithmetic.
#include "common.cuh"

template <int ACT>
__device__ __forceinline__ void gated_body(const float* __restrict__ gate, const float* __restrict__ up,
                                           float* __restrict__ y, i64 n) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    y[i] = gated_act<ACT>(gate[i], up[i]);
}

extern "C" __global__ void __launch_bounds__(256) gated_silu(const float* __restrict__ gate, const float* __restrict__ up,
                                                             float* __restrict__ y, i64 n) {
    after_previous_grid();
    gated_body<0>(gate, up, y, n);
}

extern "C" __global__ void __launch_bounds__(256) gated_gelu_tanh(const float* __restrict__ gate,
                                                                  const float* __restrict__ up, float* __restrict__ y,
                                                                  i64 n) {
    after_previous_grid();
    gated_body<1>(gate, up, y, n);
}

// gate and up side by side in one [T, 2F] array (the fused gate/up projection): y [T, F].
template <int ACT>
__device__ __forceinline__ void gated_pairs_body(const float* __restrict__ gu, float* __restrict__ y, i64 n, int f) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const i64 t = i / f, j = i % f;
    y[i] = gated_act<ACT>(gu[t * 2 * f + j], gu[t * 2 * f + f + j]);
}

extern "C" __global__ void __launch_bounds__(256) gated_pairs_silu(const float* __restrict__ gu, float* __restrict__ y,
                                                                   i64 n, int f) {
    after_previous_grid();
    gated_pairs_body<0>(gu, y, n, f);
}

extern "C" __global__ void __launch_bounds__(256) gated_pairs_gelu_tanh(const float* __restrict__ gu,
                                                                        float* __restrict__ y, i64 n, int f) {
    after_previous_grid();
    gated_pairs_body<1>(gu, y, n, f);
}

extern "C" __global__ void __launch_bounds__(256) softcap(const float* __restrict__ x, float* __restrict__ y, i64 n,
                                                          float cap) {
    after_previous_grid();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    y[i] = cap * tanhf(x[i] / cap);
}
