// QK-norm and RoPE of one rotated pair of a head: the math of rope_cache.cu, shared with the
// decode attention build that does rope_cache's work itself (attention_decode.cu, ATTN_ROPE), so
// both produce the same q, k and cache contents from the same projection output.
//
// Pair i of a head rotates dims (2i, 2i+1) when `interleaved` (GGUF llama layout), else
// (i, i + head_dim/2) (NeoX / Hugging Face layout). The formulas are those of norm.cu and rope.cu:
// x * (1 / sqrt(mean(x^2) + eps)) * w, then (x1 c - x2 s, x2 c + x1 s).
//
// Partial RoPE (Qwen3.5, Qwen3-Next): only the first rotary_dim = 2 rot_half dims turn (the tables are
// [max_pos, rot_half]). The head's head_dim/2 pairs still cover every dim once, so a norm over the head
// and the stores stay whole: pairs i < rot_half are the rotary ones ((2i, 2i+1), or NeoX's
// (i, i + rot_half)); the others carry the rest unrotated ((2i, 2i+1), or (i + rot_half, i + head_dim/2),
// which spans [rotary_dim, head_dim) in two halves). rot_half = head_dim/2 is the whole-head rotation.
#pragma once
#include "common.cuh"

// What one thread needs for pair i of a token's heads, read before the wait for the previous
// kernel (the step's positions and the constant tables, nothing a kernel of the step writes).
struct RopePair {
    int a, b;    // the pair's two dims
    float c, s;  // cos and sin of its angle at the token's position
};

__device__ __forceinline__ RopePair rope_pair(int i, int head_dim, int rot_half, int interleaved) {
    RopePair p;
    const bool turns = i < rot_half;
    p.a = interleaved ? 2 * i : (turns ? i : i + rot_half);
    p.b = interleaved ? 2 * i + 1 : (turns ? i + rot_half : i + (head_dim >> 1));
    p.c = 1.f;  // no rotation until rope_angle
    p.s = 0.f;
    return p;
}

// Pair i's cos and sin at `position` from [max_pos, rot_half] tables (a pair past the rotary dims
// keeps c = 1, s = 0); a position past the end is clamped, never read out of bounds.
__device__ __forceinline__ void rope_angle(RopePair& p, int i, int rot_half, int position,
                                           const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                                           int max_pos) {
    if (i >= rot_half) return;
    const int pos = min(max(position, 0), max_pos - 1);
    p.c = cos_t[(i64)pos * rot_half + i];
    p.s = sin_t[(i64)pos * rot_half + i];
}

// The pair's share of its head's sum of squares.
__device__ __forceinline__ float rope_pair_squares(float x1, float x2) { return x1 * x1 + x2 * x2; }

// RMS norm of the pair, from its head's sum of squares, then the rotation; (x1, x2) in place.
// Without QK-norm (`norm` false) only the rotation.
__device__ __forceinline__ void rope_norm_rotate(float& x1, float& x2, bool norm, float head_squares, int head_dim,
                                                 float eps, float wa, float wb, const RopePair& p) {
    if (norm) {
        const float inv = 1.f / sqrtf(head_squares / (float)head_dim + eps);
        x1 = x1 * inv * wa;
        x2 = x2 * inv * wb;
    }
    const float r1 = x1 * p.c - x2 * p.s, r2 = x2 * p.c + x1 * p.s;
    x1 = r1;
    x2 = r2;
}
