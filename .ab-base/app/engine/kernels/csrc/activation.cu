// Elementwise activations: gated (act(gate) * up), the attention output gate and the logit soft cap.
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

// gate and up side by side in one [T, 2F] array (the fused gate/up projection): y [T, F]. The _h
// kernels write y in float16 (rounded to nearest, as a cast would) for a down projection on its weight's
// float16 copy, which would otherwise cast y in a kernel of its own (cuda/linear.py: takes_half).
//
// vec 4 (F a multiple of 4, gu 16-byte and y 16 / 8-byte aligned: the wrapper checks): thread i takes
// elements 4i .. 4i + 3, in 16-byte loads and one store: a quarter of the threads and load instructions of
// one element a thread (that kernel read at 1.5 TB/s at 128 tokens, H100, gpu-profile-8b-s27; this one is
// not measured yet). vec 1: thread i takes element i.
__device__ __forceinline__ void gated_store4(float* y, i64 i, float4 v) { *reinterpret_cast<float4*>(y + i) = v; }
__device__ __forceinline__ void gated_store4(u16* y, i64 i, float4 v) {
    *reinterpret_cast<uint2*>(y + i) = make_uint2(pack_h2(v.x, v.y), pack_h2(v.z, v.w));
}

template <int ACT, typename Out>
__device__ __forceinline__ void gated_pairs_body(const float* __restrict__ gu, Out* __restrict__ y, i64 n, int f,
                                                 int vec) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (vec == 4) {
        const i64 e = i * 4;
        if (e >= n) return;
        const i64 t = e / f, j = e % f;  // f % 4 == 0: the four elements share a row
        const float4 g = *reinterpret_cast<const float4*>(gu + t * 2 * f + j);
        const float4 u = *reinterpret_cast<const float4*>(gu + t * 2 * f + f + j);
        gated_store4(y, e, make_float4(gated_act<ACT>(g.x, u.x), gated_act<ACT>(g.y, u.y), gated_act<ACT>(g.z, u.z),
                                       gated_act<ACT>(g.w, u.w)));
        return;
    }
    if (i >= n) return;
    const i64 t = i / f, j = i % f;
    store_as(y, i, gated_act<ACT>(gu[t * 2 * f + j], gu[t * 2 * f + f + j]));
}

#define GATED_PAIRS(NAME, ACT, OUT)                                                                              \
    extern "C" __global__ void __launch_bounds__(256) NAME(const float* __restrict__ gu, OUT* __restrict__ y, i64 n, \
                                                           int f, int vec) {                                    \
        after_previous_grid();                                                                                   \
        gated_pairs_body<ACT>(gu, y, n, f, vec);                                                                 \
    }
GATED_PAIRS(gated_pairs_silu, 0, float)
GATED_PAIRS(gated_pairs_gelu_tanh, 1, float)
GATED_PAIRS(gated_pairs_silu_h, 0, u16)
GATED_PAIRS(gated_pairs_gelu_tanh_h, 1, u16)
#undef GATED_PAIRS

extern "C" __global__ void __launch_bounds__(256) softcap(const float* __restrict__ x, float* __restrict__ y, i64 n,
                                                          float cap) {
    after_previous_grid();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    y[i] = cap * tanhf(x[i] / cap);
}

// The attention output times its gate (layers/attention.py): y [T, W] = out [T, W] * f(gate), gate
// rows `gate_stride` apart (a column slice of the fused q/k/v/gate product, read in place) holding W
// columns (per element) or W / per columns (one per head of `per` dims). f: sigmoid (KIND 0) or
// softplus (KIND 1), as the numpy reference computes them: 1 / (1 + exp(-g)) and log(1 + exp(g)).
template <int KIND>
__device__ __forceinline__ void output_gate_body(const float* __restrict__ out, const float* __restrict__ gate,
                                                 float* __restrict__ y, i64 n, int width, i64 gate_stride,
                                                 int per) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const i64 t = i / width;
    const int j = (int)(i % width);
    const float g = gate[t * gate_stride + j / per];
    const float f = KIND == 0 ? 1.f / (1.f + expf(-g)) : fmaxf(g, 0.f) + log1pf(expf(-fabsf(g)));
    y[i] = out[i] * f;
}

extern "C" __global__ void __launch_bounds__(256) output_gate_sigmoid(const float* __restrict__ out,
                                                                      const float* __restrict__ gate,
                                                                      float* __restrict__ y, i64 n, int width,
                                                                      i64 gate_stride, int per) {
    after_previous_grid();
    output_gate_body<0>(out, gate, y, n, width, gate_stride, per);
}

extern "C" __global__ void __launch_bounds__(256) output_gate_softplus(const float* __restrict__ out,
                                                                       const float* __restrict__ gate,
                                                                       float* __restrict__ y, i64 n, int width,
                                                                       i64 gate_stride, int per) {
    after_previous_grid();
    output_gate_body<1>(out, gate, y, n, width, gate_stride, per);
}
