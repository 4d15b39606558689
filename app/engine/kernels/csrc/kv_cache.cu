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
