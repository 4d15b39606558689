// Depthwise causal conv1d over time (the short conv in front of Gated DeltaNet and Mamba-2), per
// sequence of a varlen batch, continuing each sequence's conv state; SiLU fused when `activation`.
//
// x [T, C] float32 rows `x_stride` floats apart (a column slice of the in-projection), weight
// [C, K] (tap K-1 multiplies the current input), bias [C] or NULL, conv_state [slots, C, K-1]
// float32: the K-1 inputs before the sequence's chunk, oldest first. Sequence i owns rows
// query_start_loc[i]:[i+1] (decode: row i alone), its state row is state_slots[i] (negative: a
// padding row of a captured batch, left alone), and it starts from zeros where has_initial[i] is 0.
// The math and its order are recurrent_reference.causal_conv1d's: y = sum over taps of
// window[tap] * w[tap] in tap order, + bias, then y / (1 + exp(-y)).
//
// One thread per (channel, sequence): grid (ceil(C / threads), B). The thread keeps the last K-1
// inputs in registers and walks its sequence's tokens in order, so the state row it reads first is
// the one it writes last and no other thread touches either. Loads of a token row are coalesced
// over channels. Everything is read on the device (no host loop, no sync): a decode step of this
// kernel can be captured in a CUDA graph.
#include "common.cuh"

#ifndef CONV_MAX_K
#define CONV_MAX_K 8  // taps held in registers; the wrapper refuses wider kernels
#endif

// The causal conv body: DECODE takes row i as sequence i's one token (no query_start_loc read).
template <bool DECODE>
__device__ __forceinline__ void causal_conv1d_body(const float* __restrict__ x, i64 x_stride,
                                                   const float* __restrict__ weight, const float* __restrict__ bias,
                                                   float* __restrict__ conv_state,
                                                   const int* __restrict__ query_start_loc,
                                                   const int* __restrict__ state_slots,
                                                   const u8* __restrict__ has_initial, float* __restrict__ out,
                                                   int channels, int k, int activation) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x, seq = blockIdx.y;
    float w[CONV_MAX_K];
    if (c < channels) {
#pragma unroll
        for (int tap = 0; tap < CONV_MAX_K; ++tap) w[tap] = tap < k ? weight[(i64)c * k + tap] : 0.f;
    }
    const float b = (bias != nullptr && c < channels) ? bias[c] : 0.f;
    after_previous_grid();
    if (c >= channels) return;
    const int slot = state_slots[seq];
    if (slot < 0) return;
    const int start = DECODE ? seq : query_start_loc[seq], end = DECODE ? seq + 1 : query_start_loc[seq + 1];
    float* state = conv_state + ((i64)slot * channels + c) * (k - 1);
    const bool initial = has_initial[seq] != 0;
    float past[CONV_MAX_K];  // past[j]: the input j + 1 steps before the current one's window start
#pragma unroll
    for (int j = 0; j < CONV_MAX_K; ++j) past[j] = (j < k - 1 && initial) ? state[j] : 0.f;
    for (int t = start; t < end; ++t) {
        const float xt = x[(i64)t * x_stride + c];
        float y = 0.f;
#pragma unroll
        for (int tap = 0; tap < CONV_MAX_K; ++tap) {
            if (tap >= k) break;
            const float in = tap == k - 1 ? xt : past[tap];
            y = tap == 0 ? in * w[0] : y + in * w[tap];
        }
        if (bias != nullptr) y = y + b;
        if (activation) y = y / (1.f + expf(-y));
        out[(i64)t * channels + c] = y;
#pragma unroll
        for (int j = 0; j < CONV_MAX_K; ++j) {  // shift the window by one input (constant indices only)
            if (j + 1 < k - 1) past[j] = past[j + 1];
            else if (j + 1 == k - 1) past[j] = xt;
        }
    }
#pragma unroll
    for (int j = 0; j < CONV_MAX_K; ++j) {
        if (j < k - 1) state[j] = past[j];
    }
}

extern "C" __global__ void __launch_bounds__(128) causal_conv1d_varlen(
    const float* __restrict__ x, i64 x_stride, const float* __restrict__ weight, const float* __restrict__ bias,
    float* __restrict__ conv_state, const int* __restrict__ query_start_loc, const int* __restrict__ state_slots,
    const u8* __restrict__ has_initial, float* __restrict__ out, int channels, int k, int activation) {
    causal_conv1d_body<false>(x, x_stride, weight, bias, conv_state, query_start_loc, state_slots, has_initial, out,
                              channels, k, activation);
}

extern "C" __global__ void __launch_bounds__(128) causal_conv1d_update(
    const float* __restrict__ x, i64 x_stride, const float* __restrict__ weight, const float* __restrict__ bias,
    float* __restrict__ conv_state, const int* __restrict__ state_slots, const u8* __restrict__ has_initial,
    float* __restrict__ out, int channels, int k, int activation) {
    causal_conv1d_body<true>(x, x_stride, weight, bias, conv_state, nullptr, state_slots, has_initial, out, channels,
                             k, activation);
}
