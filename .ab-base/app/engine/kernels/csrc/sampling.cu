// Sampling on the GPU (sample/gpu.py): grammar masks, the Gumbel-max draw, min_tokens bans, and the chosen ids
// as int32 for the next step. Launched eagerly after each step, outside the decode graphs.
#include "common.cuh"

typedef unsigned long long u64;

// Each block scans one slice of one row and folds its best (value, id) into best[row] with a
// 64-bit atomicMax on a packed key: the value's bits made order-preserving as unsigned in the
// high word, the complement of the id in the low word (so ties go to the lowest id, as numpy's
// argmax). A row is spread over many blocks: one block per row made sampling a 30 us tail.
__device__ __forceinline__ u64 pack(float v, int i) {
    unsigned int u = __float_as_uint(v);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((u64)u << 32) | (0xFFFFFFFFu - (unsigned int)i);
}

extern "C" __global__ void __launch_bounds__(256) gumbel_argmax(const float* logits, const unsigned char* params,
        const float* cutoff, int n_rows, int vocab, u64* best) {
    // params, one pinned upload per step: seed u64 [n] | step u64 [n] | inverse temperature f32 [n] | greedy i32 [n].
    // Greedy rows take the plain argmax (no noise, no cutoff). best[] starts at 0 (no candidate).
    const int row = blockIdx.x;
    const u64 seed = reinterpret_cast<const u64*>(params)[row];
    const u64 step = reinterpret_cast<const u64*>(params)[n_rows + row];
    const float inv_t = reinterpret_cast<const float*>(params + 16 * n_rows)[row];
    const bool greedy = reinterpret_cast<const int*>(params + 20 * n_rows)[row] != 0;
    const float cut = (greedy || cutoff == nullptr) ? -PADDOCK_INF : cutoff[row];
    const float* x = logits + (i64)row * vocab;
    const int span = (vocab + gridDim.y - 1) / gridDim.y;
    const int lo = blockIdx.y * span, hi = min(vocab, lo + span);
    u64 top = 0;
    const u64 key = seed * 0x9E3779B97F4A7C15ull ^ (step + 0x632BE59BD9B4E019ull);
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float g = x[i];
        if (!greedy) {
            const float v = g * inv_t;
            if (!(v >= cut)) continue;
            u64 z = key + (u64)i * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            z ^= z >> 31;
            const float u = ((z >> 40) + 0.5f) * (1.0f / 16777216.0f);   // in (0, 1)
            g = v - logf(-logf(u));
        }
        const u64 k = pack(g, i);
        top = k > top ? k : top;
    }
    for (int o = 16; o > 0; o >>= 1) {
        const u64 other = __shfl_xor_sync(0xffffffffu, top, o);
        top = other > top ? other : top;
    }
    if ((threadIdx.x & 31) == 0 && top != 0) atomicMax(best + row, top);
}

// min_tokens bans: pairs (row, token id) whose logit becomes -inf before any cutoff or draw.
extern "C" __global__ void ban_tokens(float* logits, const int* pairs, int n_pairs, int vocab) {
    const int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k < n_pairs) logits[(i64)pairs[2 * k] * vocab + pairs[2 * k + 1]] = -PADDOCK_INF;
}

// The token ids of gumbel_argmax's packed keys (as _ids() on the host), as int32 on the device: the
// next decode step's input ids when it is launched before this step's ids are read back.
extern "C" __global__ void unpack_ids(const u64* best, int* ids, int n) {
    const int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k < n) ids[k] = best[k] == 0 ? 0 : (int)(0xFFFFFFFFu - (unsigned int)(best[k] & 0xFFFFFFFFull));
}

// Grammar masks (sample/grammar.py): a logit whose bit is clear in its row's mask (int32 words, bit
// t % 32 of word t / 32 for token t) becomes -inf, before any ban, cutoff or draw. Mask k belongs to
// logits row rows[k]: only rows with a grammar have one. Grid: (vocab / 256 blocks, masks).
extern "C" __global__ void apply_token_bitmask(float* logits, const int* masks, const int* rows, int words, int vocab) {
    const int k = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= vocab) return;
    const unsigned int word = (unsigned int)masks[(i64)k * words + (i >> 5)];
    if (!((word >> (i & 31)) & 1u)) logits[(i64)rows[k] * vocab + i] = -PADDOCK_INF;
}
