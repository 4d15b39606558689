// Depthwise causal conv1d over time (the short conv in front of Gated DeltaNet and Mamba-2), per
// sequence of a varlen batch, continuing each sequence's conv state; SiLU fused when `activation`.
//
// x [T, C] float32 rows `x_stride` floats apart (a column slice of the in-projection), weight
// [C, K] (tap K-1 multiplies the current input), bias [C] or NULL, conv_state [slots, C, K-1]
// float32: the K-1 inputs before the sequence's chunk, oldest first. Sequence i owns rows
// query_start_loc[i]:[i+1] (decode: row i alone), its state row is state_slots[i] (negative: a
// padding row of a captured batch: its output is zeros and no state row is touched), and it starts
// from zeros where has_initial[i] is 0.
// The math and its order are recurrent_reference.causal_conv1d's: y = sum over taps of
// window[tap] * w[tap] in tap order, + bias, then y / (1 + exp(-y)).
//
// One thread per (channel, sequence, chunk of `chunk` tokens): grid (ceil(C / threads), B, chunks of the
// longest sequence). The thread keeps the last K-1 inputs in registers and walks its chunk's tokens in
// order; a chunk after the first reads its window's K-1 older inputs from x. Only the first chunk's
// thread reads the channel's state row, and it alone writes the new one (the sequence's last K-1 inputs,
// from x or, for a sequence shorter than K-1, partly from the old row it holds), so no block reads a
// row another writes. Loads of a token row are coalesced over channels. Everything is read on the device (no host loop, no sync): a decode step of this
// kernel can be captured in a CUDA graph.
#include "common.cuh"

#ifndef CONV_MAX_K
#define CONV_MAX_K 8  // taps held in registers; the wrapper refuses wider kernels
#endif

// The causal conv body: DECODE takes row i as sequence i's one token (no query_start_loc read).
// Block z walks tokens [start + z chunk, + chunk) of its sequence (a decode launch: z = 0 alone).
template <bool DECODE>
__device__ __forceinline__ void causal_conv1d_body(const float* __restrict__ x, i64 x_stride,
                                                   const float* __restrict__ weight, const float* __restrict__ bias,
                                                   float* __restrict__ conv_state,
                                                   const int* __restrict__ query_start_loc,
                                                   const int* __restrict__ state_slots,
                                                   const u8* __restrict__ has_initial, float* __restrict__ out,
                                                   int channels, int k, int activation, int chunk) {
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
    const int start = DECODE ? seq : query_start_loc[seq], end = DECODE ? seq + 1 : query_start_loc[seq + 1];
    const int t0 = start + (int)blockIdx.z * chunk;
    if (t0 >= end) return;
    const int t1 = min(end, t0 + chunk);
    if (slot < 0) {  // a padding row: zeros out (finite for the layers after it), no state touched
        for (int t = t0; t < t1; ++t) out[(i64)t * channels + c] = 0.f;
        return;
    }
    float* state = conv_state + ((i64)slot * channels + c) * (k - 1);
    const bool first = blockIdx.z == 0;  // reads the old state and writes the new one (no other block touches it)
    const bool initial = has_initial[seq] != 0;
    // old[j]: the sequence's input j - (K-1) (before its first row), zeros where it starts here; past[j]:
    // the input K-1-j steps before the block's current token. A later chunk's window lies inside x
    // (chunk >= K-1, the wrapper's).
    float old[CONV_MAX_K], past[CONV_MAX_K];
#pragma unroll
    for (int j = 0; j < CONV_MAX_K; ++j) {
        old[j] = (first && initial && j < k - 1) ? state[j] : 0.f;
        past[j] = first ? old[j] : (j < k - 1 ? x[(i64)(t0 - (k - 1) + j) * x_stride + c] : 0.f);
    }
    for (int t = t0; t < t1; ++t) {
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
    if (!first) return;
    // The sequence's last K-1 inputs: rows end-(K-1)+j where they are its own, else the old state's tail.
    const int n = end - start;
#pragma unroll
    for (int j = 0; j < CONV_MAX_K; ++j) {
        if (j >= k - 1) continue;
        const int idx = j + n;  // position of input end-(K-1)+j in [old state | the sequence's rows]
        float v = 0.f;
        if (idx >= k - 1) {
            v = x[(i64)(end - (k - 1) + j) * x_stride + c];
        } else {
#pragma unroll
            for (int i = 0; i < CONV_MAX_K; ++i)
                if (i == idx) v = old[i];  // constant indices only: old stays in registers
        }
        state[j] = v;
    }
}

extern "C" __global__ void __launch_bounds__(128) causal_conv1d_varlen(
    const float* __restrict__ x, i64 x_stride, const float* __restrict__ weight, const float* __restrict__ bias,
    float* __restrict__ conv_state, const int* __restrict__ query_start_loc, const int* __restrict__ state_slots,
    const u8* __restrict__ has_initial, float* __restrict__ out, int channels, int k, int activation, int chunk) {
    causal_conv1d_body<false>(x, x_stride, weight, bias, conv_state, query_start_loc, state_slots, has_initial, out,
                              channels, k, activation, chunk);
}

extern "C" __global__ void __launch_bounds__(128) causal_conv1d_update(
    const float* __restrict__ x, i64 x_stride, const float* __restrict__ weight, const float* __restrict__ bias,
    float* __restrict__ conv_state, const int* __restrict__ state_slots, const u8* __restrict__ has_initial,
    float* __restrict__ out, int channels, int k, int activation) {
    causal_conv1d_body<true>(x, x_stride, weight, bias, conv_state, nullptr, state_slots, has_initial, out, channels,
                             k, activation, 1);
}
