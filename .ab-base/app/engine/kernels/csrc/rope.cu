// Rotary position embedding of x [T, heads, head_dim] by each token's position.
//
// One thread per pair of dims (head_dim/2 of them, rope_pair.cuh). `interleaved` pairs (2i, 2i+1)
// (GGUF llama layout); otherwise (i, i + rotary_dim/2) (NeoX / Hugging Face layout). cos/sin rows
// come from a [max_positions, rot_half] table: rot_half < head_dim/2 is partial RoPE (the first
// 2 rot_half dims turn, the rest are copied). A position past the table's end is clamped, never read
// out of bounds.
#include "rope_pair.cuh"

extern "C" __global__ void __launch_bounds__(256) rope(const float* __restrict__ x, const int* __restrict__ positions,
                                                       const float* __restrict__ cos_t,
                                                       const float* __restrict__ sin_t, float* __restrict__ y,
                                                       int n_tok, int n_heads, int head_dim, int max_pos,
                                                       int rot_half, int interleaved) {
    after_previous_grid();
    const int half = head_dim >> 1;
    const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (i64)n_tok * n_heads * half) return;
    const int i = (int)(idx % half);
    const i64 th = idx / half;  // token * n_heads + head
    const int t = (int)(th / n_heads);
    RopePair p = rope_pair(i, head_dim, rot_half, interleaved);
    rope_angle(p, i, rot_half, positions[t], cos_t, sin_t, max_pos);
    const i64 base = th * head_dim;
    const float x1 = x[base + p.a], x2 = x[base + p.b];
    y[base + p.a] = x1 * p.c - x2 * p.s;
    y[base + p.b] = x2 * p.c + x1 * p.s;
}
