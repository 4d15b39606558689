// Elementwise activations: gated (act(gate) * up) and the logit soft cap.
//
// Accurate expf/tanhf rather than the fast intrinsics: these feed a float32 parity
// test against numpy, and the kernels are bound by memory, not arithmetic.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256) gated_silu(const float* __restrict__ gate, const float* __restrict__ up,
                                                             float* __restrict__ y, i64 n) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = gate[i];
    y[i] = g / (1.f + expf(-g)) * up[i];
}

extern "C" __global__ void __launch_bounds__(256) gated_gelu_tanh(const float* __restrict__ gate,
                                                                  const float* __restrict__ up, float* __restrict__ y,
                                                                  i64 n) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = gate[i];
    const float inner = 0.7978845608028654f * (g + 0.044715f * g * g * g);  // sqrt(2/pi)
    y[i] = 0.5f * g * (1.f + tanhf(inner)) * up[i];
}

extern "C" __global__ void __launch_bounds__(256) softcap(const float* __restrict__ x, float* __restrict__ y, i64 n,
                                                          float cap) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    y[i] = cap * tanhf(x[i] / cap);
}
