// Mamba-2's selective state-space scan (SSD) and its gated group RMSNorm, for Nemotron-H and
// Granite 4 hybrid (layers/mamba2.py; the numpy reference is backend/ssd_reference.py).
//
// ssd_scan: one launch for a varlen batch, prefill chunks and decodes alike. Block (sequence,
// head, row tile): each warp owns SSD_ROWS rows p of the head's [P, N] float32 state, each lane
// the state columns n = lane + 32 j (j < SSD_NJ, N <= 32 SSD_NJ), held in registers across the
// sequence's tokens, which the block walks in order:
//     dt = softplus(dt_raw + dt_bias)    S <- exp(dt A) S + (dt x) B^T    y = S C + D x
// B and C are the head's group's (head h reads group h / (H / G)). Sequence i's rows are
// qsl[i]..qsl[i+1], its state row slots[i], read when has_init[i] (bool; else zeros) and written
// back after its last token; a negative slot skips the sequence (its y rows are left unwritten), as
// causal_conv1d.cu does. Every index comes from device arrays: no host loop, so a decode step
// is the same launch with one token per sequence and can be captured in a CUDA graph.
//
// x, B, C are column ranges of the conv's output and dt of the input projection's, so each is
// read in place with its own row stride (the (head, p) / (group, n) part contiguous).
#include "block_sum.cuh"

#ifndef SSD_NJ
#define SSD_NJ 4  // state columns per lane / 32: d_state up to 128
#endif
#ifndef SSD_ROWS
#define SSD_ROWS 4  // state rows per warp
#endif
#define SSD_WARPS 4
#define SSD_SOFTPLUS_THRESHOLD 20.f  // torch's softplus is the identity above it

__device__ __forceinline__ float ssd_softplus(float v) {
    return v > SSD_SOFTPLUS_THRESHOLD ? v : log1pf(expf(v));
}

// One token's inputs as a warp reads them: dt (raw), the lane's B and C columns, the warp's rows of x.
struct SsdToken {
    float dt, b[SSD_NJ], c[SSD_NJ], x[SSD_ROWS];
};

__device__ __forceinline__ void ssd_load(SsdToken& in, const float* __restrict__ x, i64 x_stride,
                                         const float* __restrict__ dt, i64 dt_stride, const float* __restrict__ b,
                                         const float* __restrict__ c, i64 bc_stride, int t, int h, int g, int p0,
                                         int lane, int head_dim, int d_state) {
    in.dt = dt[(i64)t * dt_stride + h];
#pragma unroll
    for (int j = 0; j < SSD_NJ; ++j) {
        const int n = lane + 32 * j;
        const i64 at = (i64)t * bc_stride + (i64)g * d_state + n;
        in.b[j] = n < d_state ? b[at] : 0.f;
        in.c[j] = n < d_state ? c[at] : 0.f;
    }
#pragma unroll
    for (int r = 0; r < SSD_ROWS; ++r)
        in.x[r] = p0 + r < head_dim ? x[(i64)t * x_stride + (i64)h * head_dim + p0 + r] : 0.f;
}

extern "C" __global__ void __launch_bounds__(SSD_WARPS * 32)
    ssd_scan(const float* __restrict__ x, i64 x_stride, const float* __restrict__ dt, i64 dt_stride,
             const float* __restrict__ dt_bias, const float* __restrict__ a, const float* __restrict__ d,
             const float* __restrict__ b, const float* __restrict__ c, i64 bc_stride, float* __restrict__ state,
             const int* __restrict__ qsl, const int* __restrict__ slots, const u8* __restrict__ has_init,
             float* __restrict__ y, int n_heads, int head_dim, int n_groups, int d_state) {
    after_previous_grid();
    const int seq = blockIdx.x, h = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int p0 = (blockIdx.z * SSD_WARPS + warp) * SSD_ROWS;
    const int slot = slots[seq];
    if (p0 >= head_dim || slot < 0) return;  // the whole warp: no shuffle is left waiting
    const int start = qsl[seq], end = qsl[seq + 1];
    const int g = h / (n_heads / n_groups);
    const i64 row_base = (((i64)slot * n_heads + h) * head_dim) * d_state;
    const bool init = has_init[seq] != 0;
    float s[SSD_ROWS][SSD_NJ];
#pragma unroll
    for (int r = 0; r < SSD_ROWS; ++r)
#pragma unroll
        for (int j = 0; j < SSD_NJ; ++j) {
            const int n = lane + 32 * j, p = p0 + r;
            s[r][j] = init && n < d_state && p < head_dim ? state[row_base + (i64)p * d_state + n] : 0.f;
        }
    const float a_h = a[h], d_h = d[h], bias = dt_bias[h];
    // The next token's inputs are loaded while the current one computes: a token's loads do not wait
    // on the state, so a prefill chunk's walk is not one memory round trip per token.
    SsdToken cur, next;
    if (start < end)
        ssd_load(next, x, x_stride, dt, dt_stride, b, c, bc_stride, start, h, g, p0, lane, head_dim, d_state);
    for (int t = start; t < end; ++t) {
        cur = next;
        if (t + 1 < end)
            ssd_load(next, x, x_stride, dt, dt_stride, b, c, bc_stride, t + 1, h, g, p0, lane, head_dim, d_state);
        const float step = ssd_softplus(cur.dt + bias);
        const float decay = expf(step * a_h);
#pragma unroll
        for (int r = 0; r < SSD_ROWS; ++r) {
            const int p = p0 + r;
            const float xv = cur.x[r];
            const float coef = step * xv;
            float acc = 0.f;
#pragma unroll
            for (int j = 0; j < SSD_NJ; ++j) {
                s[r][j] = s[r][j] * decay + coef * cur.b[j];
                acc += s[r][j] * cur.c[j];
            }
            acc = warp_sum(acc);
            if (lane == 0 && p < head_dim) y[((i64)t * n_heads + h) * head_dim + p] = acc + d_h * xv;
        }
    }
#pragma unroll
    for (int r = 0; r < SSD_ROWS; ++r)
#pragma unroll
        for (int j = 0; j < SSD_NJ; ++j) {
            const int n = lane + 32 * j, p = p0 + r;
            if (n < d_state && p < head_dim) state[row_base + (i64)p * d_state + n] = s[r][j];
        }
}

// Mamba-2's gated norm (MambaRMSNormGated, norm_before_gate=False), one block per (token, group):
//     v = y * silu(z);  out = v / sqrt(mean(v^2 over the group) + eps) * w
// y is [T, inner] (row stride y_stride), z a column range of the input projection (z_stride).
extern "C" __global__ void __launch_bounds__(1024)
    gated_group_rms_norm(const float* __restrict__ y, i64 y_stride, const float* __restrict__ z, i64 z_stride,
                         const float* __restrict__ w, float* __restrict__ out, int inner, int group_size,
                         float eps) {
    after_previous_grid();
    __shared__ float scratch[32];
    const i64 t = blockIdx.x;
    const int c0 = blockIdx.y * group_size;
    float ss = 0.f;
    for (int c = c0 + threadIdx.x; c < c0 + group_size; c += blockDim.x) {
        const float zv = z[t * z_stride + c];
        const float v = y[t * y_stride + c] * (zv / (1.f + expf(-zv)));
        out[t * inner + c] = v;  // re-read below by this same thread only
        ss += v * v;
    }
    const float inv = 1.f / sqrtf(block_sum(ss, scratch) / (float)group_size + eps);
    for (int c = c0 + threadIdx.x; c < c0 + group_size; c += blockDim.x)
        out[t * inner + c] = out[t * inner + c] * inv * w[c];
}
