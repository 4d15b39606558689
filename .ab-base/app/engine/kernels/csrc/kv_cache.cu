// Store new keys and values ([T, n_kv_heads, head_dim] float32) into the paged float16
// cache ([num_blocks, block_size, n_kv_heads, head_dim]) at each token's slot
// (block_id * block_size + offset). A negative slot marks a padding token: skipped.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256) write_kv(const float* __restrict__ k, const float* __restrict__ v,
                                                           u16* __restrict__ k_cache, u16* __restrict__ v_cache,
                                                           const int* __restrict__ slots, int n_tok, int row) {
    after_previous_grid();
    // row = n_kv_heads * head_dim: one token's K (or V) in the cache, contiguous.
    const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (i64)n_tok * row) return;
    const int t = (int)(idx / row), e = (int)(idx % row);
    const int slot = slots[t];
    if (slot < 0) return;
    const i64 dst = (i64)slot * row + e;
    k_cache[dst] = f2h(k[idx]);
    v_cache[dst] = f2h(v[idx]);
}

#if (defined(KV_FP8) && KV_FP8) || defined(PADDOCK_ALL_VARIANTS)
// -- FP8 caches (KV_FP8=1, the wrapper's define for a cache of fp8_kv.py's layout) ------------------
// data [num_blocks, block_size, n_kv, D] e4m3 bytes and scale [num_blocks, n_kv] float32 (a power
// of two per block and KV head), updated exactly as Fp8KvCache.write: a block whose slot 0 is written
// starts afresh (scale 0); its scale becomes max(old, e4m3_block_scale(amax of the values written));
// a raised scale re-encodes what the block already holds; the new values are stored as x / scale.
//
// A block's scale depends on every token written into it, so one thread block does a whole group:
// grid (token, KV head), and the thread block of a group's first token updates the (cache block,
// head) for the tokens of the group, K and V; the others return. A group is a run of consecutive
// tokens whose slots fall in one cache block: tokens that write one block must be consecutive in the
// batch, as the runner lays them out (each sequence's new tokens in order, sequence after sequence).
#include "fp8_kv.cuh"

#define KV_FP8_THREADS 128

// Max of v over the block (every thread gets it); scratch: 32 floats of shared memory.
__device__ __forceinline__ float kv_block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();  // a previous call's readers are done with scratch
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float m = 0.f;
    for (int i = 0; i < KV_FP8_THREADS / 32; ++i) m = fmaxf(m, scratch[i]);
    return m;
}

// Tokens t0 .. t1 - 1 (slots in cache block `blk`) of head h of x [T, n_kv, D] into data / scales.
__device__ __forceinline__ void kv_fp8_group(const float* __restrict__ x, u8* __restrict__ data,
                                             float* __restrict__ scales, const int* __restrict__ slots, int t0,
                                             int t1, int blk, int h, int n_kv, int D, int block_size, bool reset,
                                             float* scratch) {
    const int tid = threadIdx.x, n = (t1 - t0) * D;
    const i64 row = (i64)n_kv * D;  // one slot of the cache
    float amax = 0.f;
    for (int i = tid; i < n; i += KV_FP8_THREADS) amax = fmaxf(amax, fabsf(x[((i64)(t0 + i / D) * n_kv + h) * D + i % D]));
    amax = kv_block_max(amax, scratch);
    float* sp = scales + (i64)blk * n_kv + h;
    const float old = reset ? 0.f : *sp;
    const float s = fmaxf(old, e4m3_block_scale(amax));
    u8* base = data + (i64)blk * block_size * row + (i64)h * D;
    if (s > old && old > 0.f) {  // uniform: every thread has amax
        const float ratio = old / s;  // a power of two
        for (int i = tid; i < block_size * D; i += KV_FP8_THREADS) {
            u8* p = base + (i / D) * row + i % D;
            *p = e4m3_encode(e4m3_decode(*p) * ratio);
        }
        __syncthreads();  // re-encoded before the group's slots are overwritten
    }
    const float safe = s > 0.f ? s : 1.f;
    for (int i = tid; i < n; i += KV_FP8_THREADS) {
        const int t = t0 + i / D, d = i % D;
        data[(i64)slots[t] * row + (i64)h * D + d] = e4m3_encode(x[((i64)t * n_kv + h) * D + d] / safe);
    }
    if (tid == 0) *sp = s;
}

extern "C" __global__ void __launch_bounds__(KV_FP8_THREADS)
    write_kv_fp8(const float* __restrict__ k, const float* __restrict__ v, u8* __restrict__ k_data,
                 float* __restrict__ k_scale, u8* __restrict__ v_data, float* __restrict__ v_scale,
                 const int* __restrict__ slots, int n_tok, int n_kv, int head_dim, int block_size) {
    __shared__ float scratch[32];
    const int t0 = blockIdx.x, h = blockIdx.y;
    const int slot = slots[t0];
    if (slot < 0) return;
    const int blk = slot / block_size;
    if (t0 > 0 && slots[t0 - 1] >= 0 && slots[t0 - 1] / block_size == blk) return;  // not the group's first
    int t1 = t0 + 1;
    bool reset = slot % block_size == 0;
    while (t1 < n_tok && slots[t1] >= 0 && slots[t1] / block_size == blk) reset |= slots[t1++] % block_size == 0;
    after_previous_grid();
    kv_fp8_group(k, k_data, k_scale, slots, t0, t1, blk, h, n_kv, head_dim, block_size, reset, scratch);
    kv_fp8_group(v, v_data, v_scale, slots, t0, t1, blk, h, n_kv, head_dim, block_size, reset, scratch);
}
#endif
