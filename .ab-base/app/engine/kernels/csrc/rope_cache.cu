// From the fused q/k/v projection to attention's inputs in one launch: per-head RMS norm
// of q and k (Qwen3 / Gemma 3 QK-norm, optional), RoPE of q and k, and the float16 KV
// cache write of k and v. Replaces five launches (two norms, two ropes, one KV write).
//
// qkv is [T, (n_heads + 2 n_kv) * D] float32: q heads, then k heads, then v heads. One thread per
// rotated pair, so a head is D/2 threads, whole warps (head dims 64 to 512), and a block holds HPB =
// max(1, 256 / (D/2)) consecutive heads of one token (rope_cache.py's heads_per_block; the kernel reads it
// from blockDim): 4 heads of 128, 8 of 64, 2 of 256, 1 of 512; grid (T, cdiv(n_heads + 2 n_kv, HPB)).
// Why: one block per (token, head) made many small blocks, each a short dependent chain (positions and
// tables, the wait for the previous kernel, the row, a reduction behind a barrier, the store): 6,144
// blocks of 64 threads at 128 decode tokens of Qwen3-8B (32 q and 8 kv heads of 128, QK-norm) took
// 10.6 us, and 4.6 us at 32 tokens (H100, 2026-12-07, bench/results/gpu-profile-8b-s27). HPB times
// fewer, fuller blocks. A head's sum of squares is the one-head layout's, bit for bit: warp_sum per
// warp, then the head's warps' sums added from 0 in warp order (block_sum's order over one head;
// attention_decode.cu's ATTN_ROPE build, dec_rope_rows, relies on it). A token's last block may hold
// fewer heads: the threads past the last one load and store nothing but take part in the barrier.
// The per-pair math is rope_pair.cuh's (shared with attention_decode.cu's ATTN_ROPE build, which does
// this kernel's work at decode). A negative slot marks a padding token: its k and v are not stored
// (q still is). Tables of rot_half < head_dim/2 frequencies rotate only the first 2 rot_half dims
// (partial RoPE: rope_pair.cuh).
//
// KV_FP8=1 (an FP8 cache, fp8_kv.cuh): k_cache and v_cache are float32 rows [T, n_kv, D] indexed by
// token, not slot, which kv_cache.cu's write_kv_fp8 then stores (a block's scale depends on every
// token written into it, which no single block of this kernel sees).
#include "common.cuh"
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

#define RC_THREADS 256  // the most threads a block (rope_cache.py's BLOCK_THREADS)

extern "C" __global__ void __launch_bounds__(RC_THREADS) rope_cache(
    const float* __restrict__ qkv, int n_heads, int n_kv, int head_dim, const float* __restrict__ q_norm,
    const float* __restrict__ k_norm, float eps, const int* __restrict__ positions, const float* __restrict__ cos_t,
    const float* __restrict__ sin_t, int max_pos, int rot_half, int interleaved, rc_kv_t* __restrict__ k_cache,
    rc_kv_t* __restrict__ v_cache, const int* __restrict__ slots, float* __restrict__ q_out) {
    __shared__ float squares[RC_THREADS / 32];  // one warp's share of its head's sum of squares
    const int half = head_dim >> 1, hpb = blockDim.x / half;  // heads in the block: the wrapper's HPB
    const int t = blockIdx.x, j = threadIdx.x / half, i = threadIdx.x - j * half, h = blockIdx.y * hpb + j;
    const bool live = h < n_heads + 2 * n_kv;  // false: past the token's last head (the last block's tail)
    const bool is_v = h >= n_heads + n_kv, is_q = h < n_heads;  // uniform over each warp
    const float* w = is_q ? q_norm : k_norm;

    // Before the wait for the previous kernel (PDL, common.cuh): the step's inputs (slots and
    // positions, written by the host before the step) and constants (norm weights, rotation
    // tables), so after the wait only the projection's own output is a round trip away.
    const int slot = slots[t];
    RopePair p = rope_pair(i, head_dim, rot_half, interleaved);
    float wa = 1.f, wb = 1.f;
    if (live && !is_v) {
        if (w != nullptr) {
            wa = w[p.a];
            wb = w[p.b];
        }
        rope_angle(p, i, rot_half, positions[t], cos_t, sin_t, max_pos);
    }
    after_previous_grid();

    float x1 = 0.f, x2 = 0.f;
    if (live) {
        const float* row = qkv + ((i64)t * (n_heads + 2 * n_kv) + h) * head_dim;
        x1 = row[p.a];
        x2 = row[p.b];
    }
    const bool norm = live && !is_v && w != nullptr;
    float head_squares = 0.f;
    if (q_norm != nullptr || k_norm != nullptr) {  // uniform over the block: every thread reaches the barrier
        const int warp = threadIdx.x >> 5, wph = half >> 5;  // a head's warps: j * wph .. j * wph + wph - 1
        if (norm) {
            const float s = warp_sum(rope_pair_squares(x1, x2));
            if ((threadIdx.x & 31) == 0) squares[warp] = s;
        }
        __syncthreads();
        if (norm) {
            for (int k = 0; k < wph; ++k) head_squares += squares[j * wph + k];  // block_sum's order, from 0
        }
    }
    if (!live) return;
    const i64 kv_row = (i64)n_kv * head_dim;  // one slot of the cache

    if (is_v) {  // a v head: stored as it is
        if (slot >= 0) {
            rc_kv_t* dst = v_cache + RC_ROW(t, slot) * kv_row + (i64)(h - n_heads - n_kv) * head_dim;
            dst[p.a] = RC_VALUE(x1);
            dst[p.b] = RC_VALUE(x2);
        }
        return;
    }
    rope_norm_rotate(x1, x2, norm, head_squares, head_dim, eps, wa, wb, p);
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
