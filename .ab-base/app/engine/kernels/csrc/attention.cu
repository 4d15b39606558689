// Paged causal attention for mixed prefill + decode batches, with split-K (flash-decoding).
//
// One thread block per (query token, KV head, split): it computes the GQA group of query
// heads that share the KV head, so every K/V row it fetches serves the whole group. The
// token's visible keys [lo, pos] (causal, optionally limited to a sliding window) are cut
// into `num_splits` ranges of `split_len` keys; each block walks its range in chunks of
// CHUNK keys with an online softmax. With one split the block writes the normalized
// output; with several it writes (acc, max, sum) partials, so a long context is read by
// many blocks at once, and the last split block of a (token, KV head) to finish merges them
// (attn_merge.cuh).
//
// Score phase: G lanes share a key, each holding E of its head_dim elements of every
// group head's query in registers; their partial dot products meet through shuffles.
// Value phase: LV lanes share a value row, each with VW elements (up to 16 bytes), so a
// warp reads 32/LV rows per step; those lanes' sums meet through shuffles after the last
// chunk, then the four warps' sums in shared memory, in a fixed order.
//
// K/V are float16 [num_blocks, block_size, n_kv, head_dim]; q and out float32. Head dims 16 to 512 (powers
// of two): this kernel is the one every head size runs on where the decode and tensor-core prefill kernels
// have no variant (Gemma 4's 512-wide global heads; the tiny test models' 16 and 32).
//
// KV_FP8=1 builds read FP8 caches (fp8_kv.cuh: e4m3 codes of the same shape, a float32 scale per
// (block, KV head), passed after the float16 build's arguments): codes widen to their values times
// 2^-8 (exact), and each key's block scale times 2^8, a power of two, multiplies its score and its
// probability's value weight, so the sums are the numpy backend's over the dequantized cache.
#include "attn_merge.cuh"

#define ATTN_WARPS 4
#define ATTN_CHUNK 256
#ifndef ATTN_MINB
#define ATTN_MINB 1  // blocks per SM the register budget must allow (-DATTN_MINB=4 caps at 128 registers)
#endif

template <int D, int GMAX>
struct AttnShape {
    static constexpr int E0 = (64 / GMAX) < 16 ? (64 / GMAX) : 16;
    static constexpr int E = E0 > D / 32 ? E0 : D / 32;  // q elements per lane in the score phase
    static constexpr int G = D / E;                        // lanes per key
    static constexpr int KPW = 32 / G;                     // keys per warp per step
    static constexpr int VW0 = (64 / GMAX) > (D / 32) ? (64 / GMAX) : (D / 32);
    static constexpr int VW1 = VW0 < 8 ? VW0 : 8;  // value elements per lane (8 = one 16-byte load) ...
    static constexpr int VW = VW1 > D / 32 ? VW1 : D / 32;  // ... but 16 at D 512: one warp holds a row
    static constexpr int LV = D / VW;                       // lanes per value row
    static constexpr int KV = 32 / LV;                      // value rows per warp per step
    // A row of the shared scores: a chunk's keys, and at the end the head's output sum (D > CHUNK at 512).
    static constexpr int ROW = D > ATTN_CHUNK ? D : ATTN_CHUNK;
    static_assert(LV <= 32 && D % 16 == 0, "a value row is read by at most one warp; E and VW are float4s");
};

template <int N>
__device__ __forceinline__ void load_halves(const u16* p, float* out) {
    if constexpr (N == 2) {
        const u32 a = __ldg(reinterpret_cast<const unsigned int*>(p));
        out[0] = h2f_lo(a); out[1] = h2f_hi(a);
    } else if constexpr (N == 4) {
        const uint2 a = __ldg(reinterpret_cast<const uint2*>(p));
        out[0] = h2f_lo(a.x); out[1] = h2f_hi(a.x); out[2] = h2f_lo(a.y); out[3] = h2f_hi(a.y);
    } else {
#pragma unroll
        for (int c = 0; c < N / 8; ++c) {
            const uint4 a = __ldg(reinterpret_cast<const uint4*>(p) + c);
            float* o = out + 8 * c;
            o[0] = h2f_lo(a.x); o[1] = h2f_hi(a.x); o[2] = h2f_lo(a.y); o[3] = h2f_hi(a.y);
            o[4] = h2f_lo(a.z); o[5] = h2f_hi(a.z); o[6] = h2f_lo(a.w); o[7] = h2f_hi(a.w);
        }
    }
}

#if defined(KV_FP8) && KV_FP8
#include "fp8_kv.cuh"
#define ATTN_FP8 1
typedef u8 attn_kv_t;

// N codes at p (N-byte aligned) as floats of their values times 2^-8.
template <int N>
__device__ __forceinline__ void load_codes(const u8* p, float* out) {
    u32 w[N / 4];
    if constexpr (N == 4) {
        w[0] = __ldg(reinterpret_cast<const unsigned int*>(p));
    } else if constexpr (N == 8) {
        const uint2 a = __ldg(reinterpret_cast<const uint2*>(p));
        w[0] = a.x;
        w[1] = a.y;
    } else {
#pragma unroll
        for (int c = 0; c < N / 16; ++c) {
            const uint4 a = __ldg(reinterpret_cast<const uint4*>(p) + c);
            w[4 * c] = a.x;
            w[4 * c + 1] = a.y;
            w[4 * c + 2] = a.z;
            w[4 * c + 3] = a.w;
        }
    }
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = h2f(e4m3_to_half_2m8((w[j / 4] >> (8 * (j % 4))) & 0xffu));
}
#define ATTN_LOAD_ROW(N, p, out) load_codes<N>(p, out)
#else
#define ATTN_FP8 0
typedef u16 attn_kv_t;
#define ATTN_LOAD_ROW(N, p, out) load_halves<N>(p, out)
#endif

__device__ __forceinline__ int find_seq(const int* __restrict__ qsl, int n_seqs, int t) {
    int lo = 0, hi = n_seqs;  // the sequence i with qsl[i] <= t < qsl[i + 1]
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (__ldg(qsl + mid) <= t) lo = mid; else hi = mid;
    }
    return lo;
}

template <int D, int GMAX>
__device__ __forceinline__ void attn_body(const float* __restrict__ q, const attn_kv_t* __restrict__ k_cache,
                                          const attn_kv_t* __restrict__ v_cache, const int* __restrict__ qsl,
                                          const int* __restrict__ seq_lens, const int* __restrict__ block_tables,
                                          int table_stride, int n_seqs, int n_heads, int n_kv, int block_size,
                                          float scale, float softcap, int window, int split_len,
                                          float* __restrict__ out, float* __restrict__ part_acc,
                                          float* __restrict__ part_m, float* __restrict__ part_l,
                                          int* __restrict__ counters, const float* __restrict__ k_scale,
                                          const float* __restrict__ v_scale) {
    typedef AttnShape<D, GMAX> S;
    __shared__ float sc[GMAX][S::ROW];  // scores, then probabilities; finally the output sum
    __shared__ float m_s[GMAX], l_s[GMAX], alpha_s[GMAX];
    __shared__ int slot_s[ATTN_CHUNK];  // the chunk's cache slots, looked up once for both phases
#if ATTN_FP8
    __shared__ float ks_s[ATTN_CHUNK], vs_s[ATTN_CHUNK];  // KV_FP8: the keys' block scales, times 2^8
#endif
    __shared__ int last_split;

    const int t = blockIdx.x, g = blockIdx.y, split = blockIdx.z, n_splits = gridDim.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int group = n_heads / n_kv;
    const int head0 = g * group;

    // As many tokens as sequences (every sequence has at least one): one token each, a decode
    // batch, so token t is sequence t and the binary search's chain of dependent loads is skipped.
    const int i = gridDim.x == n_seqs ? t : find_seq(qsl, n_seqs, t);
    const int q_begin = qsl[i], q_end = qsl[i + 1];
    const int ctx = seq_lens[i];
    const int pos = ctx - (q_end - q_begin) + (t - q_begin);
    const int lo = window > 0 ? max(0, pos - window + 1) : 0;
    const int k_begin = max(lo, split * split_len);
    const int k_end = min(pos + 1, (split + 1) * split_len);
    const bool valid = t < q_end && pos >= 0;

    // A split whose range holds no visible key (common in a decode graph, planned for the
    // longest context) skips straight to the count: it writes no partials, and the merge
    // reads only the splits that can hold keys.
    const bool skip = n_splits > 1 && (!valid || k_begin >= k_end);
    if (!skip) {
        if (threadIdx.x < GMAX) {
            m_s[threadIdx.x] = -PADDOCK_INF;
            l_s[threadIdx.x] = 0.f;
        }

        // This lane's slice of every group head's query, pre-scaled.
        const int sub = lane % S::G;
        float qr[GMAX][S::E];
#pragma unroll
        for (int h = 0; h < GMAX; ++h) {
            const int hh = min(h, group - 1);
            const float* qp = q + ((i64)t * n_heads + head0 + hh) * D + sub * S::E;
#pragma unroll
            for (int e = 0; e < S::E; e += 4) {
                const float4 v = __ldg(reinterpret_cast<const float4*>(qp + e));
                qr[h][e] = v.x * scale; qr[h][e + 1] = v.y * scale; qr[h][e + 2] = v.z * scale; qr[h][e + 3] = v.w * scale;
            }
        }
        const int vsub = lane % S::LV, vslot = lane / S::LV;
        float acc[GMAX][S::VW];
#pragma unroll
        for (int h = 0; h < GMAX; ++h)
#pragma unroll
            for (int e = 0; e < S::VW; ++e) acc[h][e] = 0.f;
        __syncthreads();

        const int* table = block_tables + (i64)i * table_stride;
        const i64 kv_row = (i64)n_kv * D;  // one slot of the cache

        for (int c0 = k_begin; valid && c0 < k_end; c0 += ATTN_CHUNK) {
            const int n_c = min(ATTN_CHUNK, k_end - c0);
            // Block-table lookups for the whole chunk at once: in the loops below they would put a
            // dependent global load before every key and value load (a decode's latency is the
            // length of that chain, not its bytes).
            for (int kk = threadIdx.x; kk < n_c; kk += blockDim.x) {
                const int key = c0 + kk;
                slot_s[kk] = table[key / block_size] * block_size + key % block_size;
#if ATTN_FP8
                const i64 at = (i64)table[key / block_size] * n_kv + g;
                ks_s[kk] = k_scale[at] * E4M3_HALF_UNSCALE;
                vs_s[kk] = v_scale[at] * E4M3_HALF_UNSCALE;
#endif
            }
            __syncthreads();

            // Scores. The loop bound is uniform across the warp so the shuffles stay convergent;
            // unrolled so that several steps' key loads are in flight together.
#pragma unroll 4
            for (int base = 0; base < n_c; base += ATTN_WARPS * S::KPW) {
                const int kk = base + warp * S::KPW + lane / S::G;
                const int slot = slot_s[min(kk, n_c - 1)];
                float kv[S::E];
                ATTN_LOAD_ROW(S::E, k_cache + slot * kv_row + (i64)g * D + sub * S::E, kv);
#if ATTN_FP8
                const float k_sc = ks_s[min(kk, n_c - 1)];
#endif
#pragma unroll
                for (int h = 0; h < GMAX; ++h) {
                    float dot = 0.f;
#pragma unroll
                    for (int e = 0; e < S::E; ++e) dot = fmaf(qr[h][e], kv[e], dot);
#pragma unroll
                    for (int o = S::G / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
#if ATTN_FP8
                    dot *= k_sc;
#endif
                    if (softcap > 0.f) dot = softcap * tanhf(dot / softcap);
                    if (sub == 0 && kk < n_c && h < group) sc[h][kk] = dot;
                }
            }
            __syncthreads();

            // Online softmax, one warp per head.
            for (int h = warp; h < group; h += ATTN_WARPS) {
                float mx = -PADDOCK_INF;
                for (int kk = lane; kk < n_c; kk += 32) mx = fmaxf(mx, sc[h][kk]);
                mx = warp_max(mx);
                const float m_old = m_s[h];
                const float m_new = fmaxf(m_old, mx);
                float sum = 0.f;
                for (int kk = lane; kk < n_c; kk += 32) {
                    const float p = expf(sc[h][kk] - m_new);
                    sc[h][kk] = p;
                    sum += p;
                }
                sum = warp_sum(sum);
                __syncwarp();
                if (lane == 0) softmax_fold(h, m_new, sum, m_s, l_s, alpha_s);
            }
            __syncthreads();

            // Values.
#pragma unroll
            for (int h = 0; h < GMAX; ++h) {
                const float a = h < group ? alpha_s[h] : 0.f;
#pragma unroll
                for (int e = 0; e < S::VW; ++e) acc[h][e] *= a;
            }
#pragma unroll 8
            for (int kk = warp * S::KV + vslot; kk < n_c; kk += ATTN_WARPS * S::KV) {
                const int slot = slot_s[kk];
                float vv[S::VW];
                ATTN_LOAD_ROW(S::VW, v_cache + slot * kv_row + (i64)g * D + vsub * S::VW, vv);
#if ATTN_FP8
                const float v_sc = vs_s[kk];
#else
                const float v_sc = 1.f;
#endif
#pragma unroll
                for (int h = 0; h < GMAX; ++h) {
                    const float p = h < group ? sc[h][kk] * v_sc : 0.f;
#pragma unroll
                    for (int e = 0; e < S::VW; ++e) acc[h][e] = fmaf(p, vv[e], acc[h][e]);
                }
            }
            __syncthreads();
        }

        // The lanes that read different value rows, then the four warps, added in a fixed order.
#pragma unroll
        for (int h = 0; h < GMAX; ++h)
#pragma unroll
            for (int e = 0; e < S::VW; ++e)
#pragma unroll
                for (int o = S::LV; o < 32; o <<= 1) acc[h][e] += __shfl_xor_sync(0xffffffffu, acc[h][e], o);
        for (int w = 0; w < ATTN_WARPS; ++w) {
            if (warp == w && vslot == 0) {
#pragma unroll
                for (int h = 0; h < GMAX; ++h) {
                    if (h >= group) continue;
#pragma unroll
                    for (int e = 0; e < S::VW; ++e) {
                        float* cell = &sc[h][vsub * S::VW + e];
                        *cell = (w == 0 ? 0.f : *cell) + acc[h][e];
                    }
                }
            }
            __syncthreads();
        }

        for (int idx = threadIdx.x; idx < group * D; idx += blockDim.x) {
            const int h = idx / D, d = idx % D;
            const i64 row = (i64)t * n_heads + head0 + h;
            const float v = sc[h][d];
            if (n_splits == 1) {
                const float l = l_s[h];
                out[row * D + d] = (valid && l > 0.f) ? v / l : 0.f;
            } else {
                part_acc[(row * n_splits + split) * D + d] = v;
                if (d == 0) {
                    part_m[row * n_splits + split] = m_s[h];
                    part_l[row * n_splits + split] = l_s[h];
                }
            }
        }
    }
    if (n_splits == 1) return;

    // Publish this split's partials, then count it; the last split of (t, g) merges them all.
    if (!attn_last_to_finish(counters + (i64)t * n_kv + g, n_splits, &last_split)) return;
    // Splits first .. last are exactly those with a visible key: [max(lo, s L), min(pos + 1, (s + 1) L))
    // is non-empty for lo / L <= s <= pos / L.
    const int first = lo / split_len, last = valid ? min(pos / split_len, n_splits - 1) : -1;
    attn_merge_splits<D>(part_acc, part_m, part_l, (i64)t * n_heads + head0, group, n_splits, first, last - first + 1,
                         &sc[0][0], S::ROW, l_s, out);
}

// KV_FP8: the caches' block scales [num_blocks, n_kv] follow the float16 build's arguments.
#if ATTN_FP8
#define ATTN_SCALE_PARAMS , const float *__restrict__ k_scale, const float *__restrict__ v_scale
#define ATTN_SCALE_ARGS k_scale, v_scale
#else
#define ATTN_SCALE_PARAMS
#define ATTN_SCALE_ARGS nullptr, nullptr
#endif

#define ATTN_KERNEL(D, GMAX)                                                                                    \
    extern "C" __global__ void __launch_bounds__(ATTN_WARPS * 32, ATTN_MINB) attn_d##D##_g##GMAX(                       \
        const float* __restrict__ q, const attn_kv_t* __restrict__ k_cache, const attn_kv_t* __restrict__ v_cache, \
        const int* __restrict__ qsl, const int* __restrict__ seq_lens, const int* __restrict__ block_tables,   \
        int table_stride, int n_seqs, int n_heads, int n_kv, int block_size, float scale, float softcap,       \
        int window, int split_len, float* __restrict__ out, float* __restrict__ part_acc,                      \
        float* __restrict__ part_m, float* __restrict__ part_l, int* __restrict__ counters ATTN_SCALE_PARAMS) {\
        after_previous_grid();                                                                                  \
        attn_body<D, GMAX>(q, k_cache, v_cache, qsl, seq_lens, block_tables, table_stride, n_seqs, n_heads,    \
                           n_kv, block_size, scale, softcap, window, split_len, out, part_acc, part_m, part_l,  \
                           counters, ATTN_SCALE_ARGS);                                                          \
    }

#define ATTN_HEAD_DIM(D) ATTN_KERNEL(D, 1) ATTN_KERNEL(D, 2) ATTN_KERNEL(D, 4) ATTN_KERNEL(D, 8) ATTN_KERNEL(D, 16)

// The wrapper compiles one variant per module (-DATTN_D=128 -DATTN_G=4).
#if defined(PADDOCK_ALL_VARIANTS)
ATTN_HEAD_DIM(16)
ATTN_HEAD_DIM(32)
ATTN_HEAD_DIM(64)
ATTN_HEAD_DIM(128)
ATTN_HEAD_DIM(256)
ATTN_HEAD_DIM(512)
#else
#define ATTN_SELECTED(D, GMAX) ATTN_KERNEL(D, GMAX)  // one more expansion, so ATTN_D becomes its value
ATTN_SELECTED(ATTN_D, ATTN_G)
#endif
