// From the fused q/k/v projection to attention's inputs in one launch: per-head RMS norm
// of q and k (Qwen3 / Gemma 3 QK-norm, optional), RoPE of q and k, and the float16 KV
// cache write of k and v. Replaces five launches (two norms, two ropes, one KV write).
//
// qkv is [T, (n_heads + 2 n_kv) * D] float32: q heads, then k heads, then v heads. One
// block per (token, head of the three kinds), one thread per rotated pair (D/2 threads),
// so a head's sum of squares is one block reduction. The formulas are those of norm.cu
// and rope.cu: x * (1 / sqrt(mean(x^2) + eps)) * w, then (x1 c - x2 s, x2 c + x1 s).
// A negative slot marks a padding token: its k and v are not stored (q still is).
#include "block_sum.cuh"

extern "C" __global__ void __launch_bounds__(128) rope_cache(
    const float* __restrict__ qkv, int n_heads, int n_kv, int head_dim, const float* __restrict__ q_norm,
    const float* __restrict__ k_norm, float eps, const int* __restrict__ positions, const float* __restrict__ cos_t,
    const float* __restrict__ sin_t, int max_pos, int interleaved, u16* __restrict__ k_cache,
    u16* __restrict__ v_cache, const int* __restrict__ slots, float* __restrict__ q_out) {
    __shared__ float scratch[32];
    const int t = blockIdx.x, h = blockIdx.y, i = threadIdx.x;
    const int half = head_dim >> 1;
    const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
    const bool is_v = h >= n_heads + n_kv, is_q = h < n_heads;
    const float* w = is_q ? q_norm : k_norm;

    // Before the wait for the previous kernel (PDL, common.cuh): the step's inputs (slots and
    // positions, written by the host before the step) and constants (norm weights, rotation
    // tables), so after the wait only the projection's own output is a round trip away.
    const int slot = slots[t];
    float wa = 1.f, wb = 1.f, c = 1.f, s = 0.f;
    if (!is_v) {
        if (w != nullptr) {
            wa = w[a];
            wb = w[b];
        }
        const int pos = min(max(positions[t], 0), max_pos - 1);
        c = cos_t[(i64)pos * half + i];
        s = sin_t[(i64)pos * half + i];
    }
    after_previous_grid();

    const float* row = qkv + ((i64)t * (n_heads + 2 * n_kv) + h) * head_dim;
    float x1 = row[a], x2 = row[b];
    const i64 kv_row = (i64)n_kv * head_dim;  // one slot of the cache

    if (is_v) {  // a v head: stored as it is (the branch is uniform over the block)
        if (slot >= 0) {
            u16* dst = v_cache + slot * kv_row + (i64)(h - n_heads - n_kv) * head_dim;
            dst[a] = f2h(x1);
            dst[b] = f2h(x2);
        }
        return;
    }
    if (w != nullptr) {
        const float inv = 1.f / sqrtf(block_sum(x1 * x1 + x2 * x2, scratch) / (float)head_dim + eps);
        x1 = x1 * inv * wa;
        x2 = x2 * inv * wb;
    }
    const float r1 = x1 * c - x2 * s, r2 = x2 * c + x1 * s;
    if (is_q) {
        float* dst = q_out + ((i64)t * n_heads + h) * head_dim;
        dst[a] = r1;
        dst[b] = r2;
    } else if (slot >= 0) {
        u16* dst = k_cache + slot * kv_row + (i64)(h - n_heads) * head_dim;
        dst[a] = f2h(r1);
        dst[b] = f2h(r2);
    }
}
