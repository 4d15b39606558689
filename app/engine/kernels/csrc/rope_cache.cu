// From the fused q/k/v projection to attention's inputs in one launch: per-head RMS norm
// of q and k (Qwen3 / Gemma 3 QK-norm, optional), RoPE of q and k, and the float16 KV
// cache write of k and v. Replaces five launches (two norms, two ropes, one KV write).
//
// qkv is [T, (n_heads + 2 n_kv) * D] float32: q heads, then k heads, then v heads. One
// block per (token, head of the three kinds), one thread per rotated pair (D/2 threads),
// so a head's sum of squares is one block reduction: head dims 64 to 512, whole warps of threads (up to
// 256 of them: Gemma 4's 512-wide global heads). The per-pair math is rope_pair.cuh's
// (shared with attention_decode.cu's ATTN_ROPE build, which does this kernel's work at decode).
// A negative slot marks a padding token: its k and v are not stored (q still is). Tables of rot_half
// < head_dim/2 frequencies rotate only the first 2 rot_half dims (partial RoPE: rope_pair.cuh).
//
// KV_FP8=1 (an FP8 cache, fp8_kv.cuh): k_cache and v_cache are float32 rows [T, n_kv, D] indexed by
// token, not slot, which kv_cache.cu's write_kv_fp8 then stores (a block's scale depends on every
// token written into it, which no single block of this kernel sees).
#include "block_sum.cuh"
#include "rope_pair.cuh"

#if defined(KV_FP8) && KV_FP8
typedef float rc_kv_t;
#define RC_ROW(t, slot) (t)
#define RC_VALUE(x) (x)
#else
typedef u16 rc_kv_t;
#define RC_ROW(t, slot) slot
#define RC_VALUE(x) f2h(x)
#endif

extern "C" __global__ void __launch_bounds__(256) rope_cache(
    const float* __restrict__ qkv, int n_heads, int n_kv, int head_dim, const float* __restrict__ q_norm,
    const float* __restrict__ k_norm, float eps, const int* __restrict__ positions, const float* __restrict__ cos_t,
    const float* __restrict__ sin_t, int max_pos, int rot_half, int interleaved, rc_kv_t* __restrict__ k_cache,
    rc_kv_t* __restrict__ v_cache, const int* __restrict__ slots, float* __restrict__ q_out) {
    __shared__ float scratch[32];
    const int t = blockIdx.x, h = blockIdx.y, i = threadIdx.x;
    const bool is_v = h >= n_heads + n_kv, is_q = h < n_heads;
    const float* w = is_q ? q_norm : k_norm;

    // Before the wait for the previous kernel (PDL, common.cuh): the step's inputs (slots and
    // positions, written by the host before the step) and constants (norm weights, rotation
    // tables), so after the wait only the projection's own output is a round trip away.
    const int slot = slots[t];
    RopePair p = rope_pair(i, head_dim, rot_half, interleaved);
    float wa = 1.f, wb = 1.f;
    if (!is_v) {
        if (w != nullptr) {
            wa = w[p.a];
            wb = w[p.b];
        }
        rope_angle(p, i, rot_half, positions[t], cos_t, sin_t, max_pos);
    }
    after_previous_grid();

    const float* row = qkv + ((i64)t * (n_heads + 2 * n_kv) + h) * head_dim;
    float x1 = row[p.a], x2 = row[p.b];
    const i64 kv_row = (i64)n_kv * head_dim;  // one slot of the cache

    if (is_v) {  // a v head: stored as it is (the branch is uniform over the block)
        if (slot >= 0) {
            rc_kv_t* dst = v_cache + RC_ROW(t, slot) * kv_row + (i64)(h - n_heads - n_kv) * head_dim;
            dst[p.a] = RC_VALUE(x1);
            dst[p.b] = RC_VALUE(x2);
        }
        return;
    }
    const bool norm = w != nullptr;
    rope_norm_rotate(x1, x2, norm, norm ? block_sum(rope_pair_squares(x1, x2), scratch) : 0.f, head_dim, eps, wa, wb,
                     p);
    if (is_q) {
        float* dst = q_out + ((i64)t * n_heads + h) * head_dim;
        dst[p.a] = x1;
        dst[p.b] = x2;
    } else if (slot >= 0) {
        rc_kv_t* dst = k_cache + RC_ROW(t, slot) * kv_row + (i64)(h - n_heads) * head_dim;
        dst[p.a] = RC_VALUE(x1);
        dst[p.b] = RC_VALUE(x2);
    }
}
