// Rotary position embedding of x [T, heads, head_dim] by each token's position.
//
// One thread per rotated pair. `interleaved` pairs (2i, 2i+1) (GGUF llama layout);
// otherwise (i, i + head_dim/2) (NeoX / Hugging Face layout). cos/sin rows come from a
// [max_positions, head_dim/2] table; a position past its end is clamped, never read
// out of bounds.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256) rope(const float* __restrict__ x, const int* __restrict__ positions,
                                                       const float* __restrict__ cos_t,
                                                       const float* __restrict__ sin_t, float* __restrict__ y,
                                                       int n_tok, int n_heads, int head_dim, int max_pos,
                                                       int interleaved) {
    after_previous_grid();
    const int half = head_dim >> 1;
    const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (i64)n_tok * n_heads * half) return;
    const int i = (int)(idx % half);
    const i64 th = idx / half;  // token * n_heads + head
    const int t = (int)(th / n_heads);
    const int pos = min(max(positions[t], 0), max_pos - 1);
    const float c = cos_t[(i64)pos * half + i], s = sin_t[(i64)pos * half + i];
    const i64 base = th * head_dim;
    const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
    const float x1 = x[base + a], x2 = x[base + b];
    y[base + a] = x1 * c - x2 * s;
    y[base + b] = x2 * c + x1 * s;
}
