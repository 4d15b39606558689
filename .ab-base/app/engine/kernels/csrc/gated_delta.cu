// Gated DeltaNet (Qwen3.5, Qwen3-Next) on CUDA: the gated delta rule over a varlen batch or a decode
// step, and the gated RMSNorm epilogue. The math is recurrent_reference.gated_delta_rule's, per value
// head h of a sequence, with state S [DK, DV] float32 and per token t:
//   q, k L2-normalised (eps L2_EPS), q scaled by q_scale = DK^-0.5;
//   beta = sigmoid(b_t), g = neg_a[h] * softplus(a_t + dt_bias[h]) (threshold 20, as PyTorch);
//   S <- exp(g) S;  delta = beta (v - k S);  S <- S + k delta^T;  o = q S.
//
// Inputs straight from the layer: `mixed` [T, conv_dim] (the conv's output: q heads, k heads, v heads)
// and `ba` [T, >= 2 Hv] (the in-projection's b then a columns), each with its own row stride. Value
// head h reads q/k head `tiled ? h % Hk : h / (Hv / Hk)` (llama.cpp's Qwen3.5 order, or Hugging Face's).
//
// One block per (32 value columns, value head, sequence): 4 warps, lane = column, warp w holding rows
// [w DK/4, (w+1) DK/4) of the state's columns in registers, so S is read once from the state row and
// written back once after the sequence's last token. Per token the block stages q and k in shared
// memory, and the two products over DK (k S and q S) are per-thread partial sums reduced across the
// warps through shared memory: three barriers a token, its inputs loaded while the token before it
// computes. Tokens run in order within the launch: decode, and prefill batches of short chunks
// (gated_delta_chunked below takes longer ones). Sequence i owns rows
// query_start_loc[i]:[i+1] (decode: row i), its state row is state_slots[i] (negative: a padding row,
// zeros out and no state touched), and it starts from zeros where has_initial[i] is 0. All read on the device: a decode step
// can be captured in a CUDA graph.
#include "attn_merge.cuh"
#include "block_sum.cuh"

#ifndef GDN_DK
#define GDN_DK 128  // head_k_dim (the wrapper compiles one module per size)
#endif
#define GDN_WARPS 4
#define GDN_COLS 32
#define GDN_L2_EPS 1e-6f  // recurrent_reference.L2_EPS (fla's)
#define GDN_PER_THREAD ((GDN_DK + GDN_WARPS * 32 - 1) / (GDN_WARPS * 32))  // q and k elements a thread stages

// One token's inputs as one thread loads them: its share of q and k (elements tid, tid + 128, ...),
// its column of v, and the head's raw gates. Loaded a token ahead, so the loads of token t + 1 are in
// flight while token t's products run.
struct GdnToken {
    float q[GDN_PER_THREAD], k[GDN_PER_THREAD], v, b, a;
};

__device__ __forceinline__ void gdn_load(GdnToken& in, const float* __restrict__ row, const float* __restrict__ gates,
                                         i64 q_off, i64 k_off, i64 v_off, bool col, int tid, int h, int n_v_heads) {
#pragma unroll
    for (int e = 0; e < GDN_PER_THREAD; ++e) {
        const int i = tid + e * GDN_WARPS * 32;
        in.q[e] = i < GDN_DK ? row[q_off + i] : 0.f;
        in.k[e] = i < GDN_DK ? row[k_off + i] : 0.f;
    }
    in.v = col ? row[v_off] : 0.f;
    in.b = gates[h];
    in.a = gates[n_v_heads + h];
}

// A decode step with the short conv fused in (gated_delta_decode_fused): `mixed` is the in-projection's
// row, the conv's input, and each q/k/v input goes through its channel's taps and conv state here, as
// causal_conv1d.cu computes them (the taps in order, SiLU). weight [C, k], state [slots, C, k - 1].
struct GdnConv {
    const float* w;
    float* state;
    int channels, k;
};
#define GDN_CONV_MAX_K 8  // taps in the unrolled loop; the wrapper refuses wider convs

// The conv's SiLU output for channel c: state row `old` (nullptr: a sequence starting here, zeros) and input x.
__device__ __forceinline__ float gdn_conv(const GdnConv& cv, i64 c, const float* old, float x) {
    float y = 0.f;
#pragma unroll
    for (int tap = 0; tap < GDN_CONV_MAX_K; ++tap) {
        if (tap >= cv.k) break;
        const float in = tap == cv.k - 1 ? x : (old != nullptr ? old[tap] : 0.f);
        const float w = cv.w[c * cv.k + tap];
        y = tap == 0 ? in * w : y + in * w;
    }
    return y / (1.f + expf(-y));
}

// Channel c's state row after the step: its last k - 1 inputs (the old row shifted by one, x last).
__device__ __forceinline__ void gdn_conv_shift(const GdnConv& cv, float* row, bool initial, float x) {
    for (int i = 0; i + 1 < cv.k; ++i) row[i] = i + 2 < cv.k ? (initial ? row[i + 1] : 0.f) : x;
}

// gdn_load through the conv. The token's v column belongs to this block alone: the body shifts its state row
// once every warp has read it; q and k are read by all the blocks of their key head, whose last block
// shifts theirs (gated_delta_decode_fused).
__device__ __forceinline__ void gdn_load_conv(GdnToken& in, const GdnConv& cv, int slot, bool initial,
                                              const float* __restrict__ row, const float* __restrict__ gates,
                                              i64 q_off, i64 k_off, i64 v_off, bool col, int tid, int h,
                                              int n_v_heads) {
    const float* states = cv.state + (i64)slot * cv.channels * (cv.k - 1);
#pragma unroll
    for (int e = 0; e < GDN_PER_THREAD; ++e) {
        const int i = tid + e * GDN_WARPS * 32;
        const i64 cq = q_off + i, ck = k_off + i;
        in.q[e] = i < GDN_DK ? gdn_conv(cv, cq, initial ? states + cq * (cv.k - 1) : nullptr, row[cq]) : 0.f;
        in.k[e] = i < GDN_DK ? gdn_conv(cv, ck, initial ? states + ck * (cv.k - 1) : nullptr, row[ck]) : 0.f;
    }
    in.v = col ? gdn_conv(cv, v_off, initial ? states + v_off * (cv.k - 1) : nullptr, row[v_off]) : 0.f;
    in.b = gates[h];
    in.a = gates[n_v_heads + h];
}

// Zeros for rows [start, end) of column j of value head h: a padding sequence's output (state_slots < 0),
// finite for the layers after it.
__device__ __forceinline__ void gdn_zero_rows(float* __restrict__ out, int start, int end, int h, int n_v_heads,
                                              int dv, int j, bool writes) {
    if (!writes) return;
    for (int t = start; t < end; ++t) out[((i64)t * n_v_heads + h) * dv + j] = 0.f;
}

// CONV (decode only): `mixed` is the conv's input, `conv` its weights and states (gdn_load_conv).
template <bool DECODE, bool CONV = false>
__device__ __forceinline__ void gated_delta_body(
    const float* __restrict__ mixed, i64 mixed_stride, const float* __restrict__ ba, i64 ba_stride,
    const float* __restrict__ neg_a, const float* __restrict__ dt_bias, float* __restrict__ state,
    const int* __restrict__ query_start_loc, const int* __restrict__ state_slots, const u8* __restrict__ has_initial,
    float* __restrict__ out, int n_k_heads, int n_v_heads, int dv, int tiled, float q_scale,
    const GdnConv conv = GdnConv()) {
    static_assert(DECODE || !CONV, "the conv is fused into decode steps only");
    constexpr int R = GDN_DK / GDN_WARPS;
    // Two partial-sum buffers (k S, then q S), so one barrier orders each product's writes and reads;
    // q and k are rewritten only after the last barrier of the token that read them.
    __shared__ float sq[GDN_DK], sk[GDN_DK], red_kS[GDN_WARPS][GDN_COLS], red_qS[GDN_WARPS][GDN_COLS];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int h = blockIdx.y, seq = blockIdx.z, j = blockIdx.x * GDN_COLS + lane;
    const bool col = j < dv;
    const int hk = tiled ? h % n_k_heads : h / (n_v_heads / n_k_heads);
    const float na = neg_a[h], bias = dt_bias[h];  // constants: read before the wait (PDL)
    after_previous_grid();
    const int slot = state_slots[seq];
    const int start = DECODE ? seq : query_start_loc[seq], end = DECODE ? seq + 1 : query_start_loc[seq + 1];
    if (slot < 0 || start >= end) {  // uniform over the block; a padding row's output is zeros
        gdn_zero_rows(out, start, end, h, n_v_heads, dv, j, col && warp == 0);
        return;
    }
    const i64 key_dim = (i64)n_k_heads * GDN_DK;
    const i64 q_off = (i64)hk * GDN_DK, k_off = key_dim + q_off, v_off = 2 * key_dim + (i64)h * dv + j;
    float* srow = state + (((i64)slot * n_v_heads + h) * GDN_DK + warp * R) * dv + j;
    const bool initial = has_initial[seq] != 0;
    float s[R];
#pragma unroll
    for (int r = 0; r < R; ++r) s[r] = (initial && col) ? srow[(i64)r * dv] : 0.f;

    GdnToken next;
    if constexpr (CONV) {
        const float* row = mixed + (i64)start * mixed_stride;
        gdn_load_conv(next, conv, slot, initial, row, ba + (i64)start * ba_stride, q_off, k_off, v_off, col, tid, h,
                      n_v_heads);
        __syncthreads();  // every warp has read the v column's conv state: warp 0 shifts it
        if (warp == 0 && col)
            gdn_conv_shift(conv, conv.state + ((i64)slot * conv.channels + v_off) * (conv.k - 1), initial, row[v_off]);
    } else {
        gdn_load(next, mixed + (i64)start * mixed_stride, ba + (i64)start * ba_stride, q_off, k_off, v_off, col, tid,
                 h, n_v_heads);
    }
    for (int t = start; t < end; ++t) {
        const GdnToken cur = next;
        if (t + 1 < end)
            gdn_load(next, mixed + (i64)(t + 1) * mixed_stride, ba + (i64)(t + 1) * ba_stride, q_off, k_off, v_off,
                     col, tid, h, n_v_heads);
#pragma unroll
        for (int e = 0; e < GDN_PER_THREAD; ++e) {
            const int i = tid + e * GDN_WARPS * 32;
            if (i < GDN_DK) {
                sq[i] = cur.q[e];
                sk[i] = cur.k[e];
            }
        }
        __syncthreads();
        float ssq = 0.f, ssk = 0.f;  // |q|^2 and |k|^2, each warp for itself (no barrier to share them)
        for (int i = lane; i < GDN_DK; i += 32) {
            ssq += sq[i] * sq[i];
            ssk += sk[i] * sk[i];
        }
        ssq = warp_sum(ssq);
        ssk = warp_sum(ssk);
        const float inv_q = 1.f / sqrtf(ssq + GDN_L2_EPS), inv_k = 1.f / sqrtf(ssk + GDN_L2_EPS);
        const float beta = 1.f / (1.f + expf(-cur.b));
        const float x = cur.a + bias;
        const float softplus = x > 20.f ? x : log1pf(expf(fminf(x, 20.f)));
        const float decay = expf(na * softplus);
        float p = 0.f;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            s[r] *= decay;
            p += sk[warp * R + r] * inv_k * s[r];
        }
        red_kS[warp][lane] = p;
        __syncthreads();
        float predicted = 0.f;
#pragma unroll
        for (int w = 0; w < GDN_WARPS; ++w) predicted += red_kS[w][lane];
        const float delta = (cur.v - predicted) * beta;
        float o = 0.f;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            s[r] += sk[warp * R + r] * inv_k * delta;
            o += sq[warp * R + r] * inv_q * q_scale * s[r];
        }
        red_qS[warp][lane] = o;
        __syncthreads();
        if (warp == 0 && col) {
            float total = 0.f;
#pragma unroll
            for (int w = 0; w < GDN_WARPS; ++w) total += red_qS[w][lane];
            out[((i64)t * n_v_heads + h) * dv + j] = total;
        }
    }
    if (col) {
#pragma unroll
        for (int r = 0; r < R; ++r) srow[(i64)r * dv] = s[r];
    }
}

extern "C" __global__ void __launch_bounds__(GDN_WARPS * 32) gated_delta_varlen(
    const float* __restrict__ mixed, i64 mixed_stride, const float* __restrict__ ba, i64 ba_stride,
    const float* __restrict__ neg_a, const float* __restrict__ dt_bias, float* __restrict__ state,
    const int* __restrict__ query_start_loc, const int* __restrict__ state_slots, const u8* __restrict__ has_initial,
    float* __restrict__ out, int n_k_heads, int n_v_heads, int dv, int tiled, float q_scale) {
    gated_delta_body<false>(mixed, mixed_stride, ba, ba_stride, neg_a, dt_bias, state, query_start_loc, state_slots,
                            has_initial, out, n_k_heads, n_v_heads, dv, tiled, q_scale);
}

extern "C" __global__ void __launch_bounds__(GDN_WARPS * 32) gated_delta_decode(
    const float* __restrict__ mixed, i64 mixed_stride, const float* __restrict__ ba, i64 ba_stride,
    const float* __restrict__ neg_a, const float* __restrict__ dt_bias, float* __restrict__ state,
    const int* __restrict__ state_slots, const u8* __restrict__ has_initial, float* __restrict__ out, int n_k_heads,
    int n_v_heads, int dv, int tiled, float q_scale) {
    gated_delta_body<true>(mixed, mixed_stride, ba, ba_stride, neg_a, dt_bias, state, nullptr, state_slots,
                           has_initial, out, n_k_heads, n_v_heads, dv, tiled, q_scale);
}

// The head's normalized output (gated_rms_norm's math) in gated_delta_decode_fused's last block of a (sequence,
// head): y = o * rstd * w * silu(z) over the head's dv raw outputs in `out`, z rows z_stride apart.
__device__ __forceinline__ void gdn_norm_head(const float* __restrict__ out, const float* __restrict__ z, i64 z_stride,
                                              const float* __restrict__ norm_w, float eps, float* __restrict__ y,
                                              int n_v_heads, int dv) {
    __shared__ float scratch[32];
    const int h = blockIdx.y, seq = blockIdx.z;
    const i64 row = ((i64)seq * n_v_heads + h) * dv;  // decode: row `seq` is sequence seq's token
    const float* zr = z + (i64)seq * z_stride + (i64)h * dv;
    float ss = 0.f;
    for (int c = threadIdx.x; c < dv; c += blockDim.x) {
        const float v = __ldcg(out + row + c);  // other blocks' columns: from L2, past this SM's L1
        ss += v * v;
    }
    const float inv = 1.f / sqrtf(block_sum(ss, scratch) / (float)dv + eps);
    for (int c = threadIdx.x; c < dv; c += blockDim.x) {
        const float g = zr[c];
        y[row + c] = __ldcg(out + row + c) * inv * norm_w[c] * (g / (1.f + expf(-g)));
    }
}

// A decode step with the short conv before it and the gated RMSNorm after it fused in (one launch where
// there were three): `mixed` is the in-projection's q/k/v columns, the conv's input (gdn_load_conv); the v
// columns' conv states are shifted by their blocks, the q/k ones by the last block of their key head to
// finish (`conv_counters`, one per (sequence, key head), as `counters` one per (sequence, value head)).
extern "C" __global__ void __launch_bounds__(GDN_WARPS * 32) gated_delta_decode_fused(
    const float* __restrict__ mixed, i64 mixed_stride, const float* __restrict__ ba, i64 ba_stride,
    const float* __restrict__ neg_a, const float* __restrict__ dt_bias, float* __restrict__ state,
    const int* __restrict__ state_slots, const u8* __restrict__ has_initial, float* __restrict__ out, int n_k_heads,
    int n_v_heads, int dv, int tiled, float q_scale, const float* __restrict__ z, i64 z_stride,
    const float* __restrict__ norm_w, float eps, int* __restrict__ counters, float* __restrict__ y,
    const float* __restrict__ conv_w, float* __restrict__ conv_state, int channels, int conv_k,
    int* __restrict__ conv_counters) {
    const GdnConv conv{conv_w, conv_state, channels, conv_k};
    gated_delta_body<true, true>(mixed, mixed_stride, ba, ba_stride, neg_a, dt_bias, state, nullptr, state_slots,
                                 has_initial, out, n_k_heads, n_v_heads, dv, tiled, q_scale, conv);
    __shared__ int last;
    const int h = blockIdx.y, seq = blockIdx.z, group = n_v_heads / n_k_heads;
    const int hk = tiled ? h % n_k_heads : h / group;
    if (attn_last_to_finish(conv_counters + (i64)seq * n_k_heads + hk, gridDim.x * group, &last)) {
        const int slot = state_slots[seq];  // every block of the key head has read its q/k conv states
        if (slot >= 0) {
            const bool initial = has_initial[seq] != 0;
            const i64 key_dim = (i64)n_k_heads * GDN_DK;
            for (int i = threadIdx.x; i < 2 * GDN_DK; i += blockDim.x) {
                const i64 c = (i < GDN_DK ? 0 : key_dim - GDN_DK) + (i64)hk * GDN_DK + i;  // q, then k channels
                gdn_conv_shift(conv, conv_state + ((i64)slot * channels + c) * (conv_k - 1), initial,
                               mixed[(i64)seq * mixed_stride + c]);
            }
        }
    }
    if (attn_last_to_finish(counters + (i64)seq * n_v_heads + h, gridDim.x, &last))
        gdn_norm_head(out, z, z_stride, norm_w, eps, y, n_v_heads, dv);
}

// The chunked form for prefill: the same blocks (sequence, value head, 32 columns) and state slice in
// registers, but GDN_CHUNK tokens per round with six barriers instead of three per token. Within a
// chunk of n tokens, with G_i = exp(cum_i) the decay from the chunk's start through token i and S0 the
// state at its start, the recurrence unrolls to
//   delta_i = beta_i (v_i - G_i k_i.S0 - sum_{j<i} exp(cum_i - cum_j) (k_i.k_j) delta_j)
//   o_i     = G_i q_i.S0 + sum_{j<=i} exp(cum_i - cum_j) (q_i.k_j) delta_j
//   S       = G_{n-1} S0 + sum_i exp(cum_{n-1} - cum_i) k_i delta_i^T
// (the UT / WY form of recurrent_reference.delta_rule_chunked, solved here by forward substitution per
// column). Every warp takes its share of the pair products k_i.k_j, q_i.k_j and of k_i.S0, q_i.S0 over
// its state rows; warp 0 (lane = column) runs the substitution, the short sequential part.
#ifndef GDN_CHUNK
#define GDN_CHUNK (GDN_DK > 128 ? 8 : 16)  // tokens a round: q and k of the chunk fit static shared memory
#endif

// (a.b, c.d) over GDN_DK elements, summed by the warp (every lane gets both).
__device__ __forceinline__ float2 gdn_warp_dots(const float* a, const float* b, const float* c, const float* d) {
    float ab = 0.f, cd = 0.f;
    for (int e = threadIdx.x & 31; e < GDN_DK; e += 32) {
        ab += a[e] * b[e];
        cd += c[e] * d[e];
    }
    return make_float2(warp_sum(ab), warp_sum(cd));
}

extern "C" __global__ void __launch_bounds__(GDN_WARPS * 32) gated_delta_chunked(
    const float* __restrict__ mixed, i64 mixed_stride, const float* __restrict__ ba, i64 ba_stride,
    const float* __restrict__ neg_a, const float* __restrict__ dt_bias, float* __restrict__ state,
    const int* __restrict__ query_start_loc, const int* __restrict__ state_slots, const u8* __restrict__ has_initial,
    float* __restrict__ out, int n_k_heads, int n_v_heads, int dv, int tiled, float q_scale) {
    constexpr int R = GDN_DK / GDN_WARPS, C = GDN_CHUNK, NT = GDN_WARPS * 32;
    __shared__ float sq[C][GDN_DK], sk[C][GDN_DK];  // the chunk's q and k, normalised in place
    __shared__ float red_k[GDN_WARPS][C][GDN_COLS], red_q[GDN_WARPS][C][GDN_COLS];  // k_i.S0, q_i.S0 per warp
    __shared__ float ekk[C][C], eqk[C][C];  // exp(cum_i - cum_j) k_i.k_j (j < i), ... q_i.k_j (j <= i)
    __shared__ float dl[C][GDN_COLS];       // delta_i of each column
    __shared__ float cum[C], beta_s[C], inv_q[C], inv_k[C], tail[C];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int h = blockIdx.y, seq = blockIdx.z, j = blockIdx.x * GDN_COLS + lane;
    const bool col = j < dv;
    const int hk = tiled ? h % n_k_heads : h / (n_v_heads / n_k_heads);
    const float na = neg_a[h], bias = dt_bias[h];
    after_previous_grid();
    const int slot = state_slots[seq];
    const int start = query_start_loc[seq], end = query_start_loc[seq + 1];
    if (slot < 0) {  // uniform over the block; a padding row's output is zeros
        gdn_zero_rows(out, start, end, h, n_v_heads, dv, j, col && warp == 0);
        return;
    }
    const i64 key_dim = (i64)n_k_heads * GDN_DK;
    const i64 q_off = (i64)hk * GDN_DK, k_off = key_dim + q_off, v_off = 2 * key_dim + (i64)h * dv + j;
    float* srow = state + (((i64)slot * n_v_heads + h) * GDN_DK + warp * R) * dv + j;
    const bool initial = has_initial[seq] != 0;
    float s[R];
#pragma unroll
    for (int r = 0; r < R; ++r) s[r] = (initial && col) ? srow[(i64)r * dv] : 0.f;

    for (int t0 = start; t0 < end; t0 += C) {
        const int n = min(C, end - t0);
        for (int e = tid; e < n * GDN_DK; e += NT) {
            const int i = e / GDN_DK, d = e % GDN_DK;
            const float* row = mixed + (i64)(t0 + i) * mixed_stride;
            sq[i][d] = row[q_off + d];
            sk[i][d] = row[k_off + d];
        }
        if (tid < n) {
            const float* gates = ba + (i64)(t0 + tid) * ba_stride;
            beta_s[tid] = 1.f / (1.f + expf(-gates[h]));
            const float x = gates[n_v_heads + h] + bias;
            cum[tid] = na * (x > 20.f ? x : log1pf(expf(fminf(x, 20.f))));  // g, summed below
        }
        __syncthreads();
        if (tid == 0)
            for (int i = 1; i < n; ++i) cum[i] += cum[i - 1];
        for (int i = warp; i < n; i += GDN_WARPS) {  // |q_i|^2, |k_i|^2: a warp per token
            const float2 ss = gdn_warp_dots(sq[i], sq[i], sk[i], sk[i]);
            if (lane == 0) {
                inv_q[i] = 1.f / sqrtf(ss.x + GDN_L2_EPS);
                inv_k[i] = 1.f / sqrtf(ss.y + GDN_L2_EPS);
            }
        }
        __syncthreads();
        for (int e = tid; e < n * GDN_DK; e += NT) {
            const int i = e / GDN_DK, d = e % GDN_DK;
            sq[i][d] = sq[i][d] * inv_q[i] * q_scale;
            sk[i][d] = sk[i][d] * inv_k[i];
        }
        if (tid < n) tail[tid] = expf(cum[n - 1] - cum[tid]);
        __syncthreads();
        for (int p = warp; p < C * C; p += GDN_WARPS) {  // the pair products, a warp per (i, j)
            const int i = p / C, jj = p % C;
            if (i >= n || jj > i) {
                if (lane == 0) ekk[i][jj] = eqk[i][jj] = 0.f;
                continue;  // uniform over the warp
            }
            const float2 dots = gdn_warp_dots(sk[i], sk[jj], sq[i], sk[jj]);  // (k_i.k_j, q_i.k_j)
            if (lane == 0) {
                const float decay = expf(cum[i] - cum[jj]);
                ekk[i][jj] = jj < i ? decay * dots.x : 0.f;
                eqk[i][jj] = decay * dots.y;
            }
        }
#pragma unroll
        for (int i = 0; i < C; ++i) {  // k_i.S0 and q_i.S0 over this warp's rows
            if (i >= n) break;
            float pk = 0.f, pq = 0.f;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                pk += sk[i][warp * R + r] * s[r];
                pq += sq[i][warp * R + r] * s[r];
            }
            red_k[warp][i][lane] = pk;
            red_q[warp][i][lane] = pq;
        }
        __syncthreads();
        if (warp == 0) {  // forward substitution for this lane's column, then its outputs
            float delta[C];
#pragma unroll
            for (int i = 0; i < C; ++i) {
                delta[i] = 0.f;
                if (i >= n) continue;
                float ks = 0.f, qs = 0.f;
#pragma unroll
                for (int w = 0; w < GDN_WARPS; ++w) {
                    ks += red_k[w][i][lane];
                    qs += red_q[w][i][lane];
                }
                const float gam = expf(cum[i]);
                float u = (col ? mixed[(i64)(t0 + i) * mixed_stride + v_off] : 0.f) - gam * ks;
#pragma unroll
                for (int jj = 0; jj < i; ++jj) u -= ekk[i][jj] * delta[jj];
                delta[i] = beta_s[i] * u;
                float o = gam * qs;
#pragma unroll
                for (int jj = 0; jj <= i; ++jj) o += eqk[i][jj] * delta[jj];
                if (col) out[((i64)(t0 + i) * n_v_heads + h) * dv + j] = o;
                dl[i][lane] = delta[i];
            }
        }
        __syncthreads();
        const float total = expf(cum[n - 1]);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            float acc = s[r] * total;
#pragma unroll
            for (int i = 0; i < C; ++i) {
                if (i >= n) break;
                acc += tail[i] * sk[i][warp * R + r] * dl[i][lane];
            }
            s[r] = acc;
        }
        __syncthreads();  // the next chunk overwrites q, k, the pair products and the deltas
    }
    if (col) {
#pragma unroll
        for (int r = 0; r < R; ++r) srow[(i64)r * dv] = s[r];
    }
}

// The epilogue: out[row] = RMSNorm(x[row]) * w * silu(z[row]) per value head, rows = T * Hv of `dim`
// columns; z is [T, >= Hv * dim] with row stride z_stride (the in-projection's z columns). One block
// per row; norm.cu's float32 order: x * (1 / sqrt(mean(x^2) + eps)) * w, silu(z) = z / (1 + exp(-z)).
extern "C" __global__ void __launch_bounds__(1024) gated_rms_norm(const float* __restrict__ x,
                                                                  const float* __restrict__ z, i64 z_stride,
                                                                  int heads, const float* __restrict__ w, float eps,
                                                                  float* __restrict__ out, int dim) {
    after_previous_grid();
    __shared__ float scratch[32];
    const i64 row = blockIdx.x, base = row * dim;
    const float* zr = z + (row / heads) * z_stride + (row % heads) * dim;
    float ss = 0.f;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) ss += x[base + c] * x[base + c];
    const float inv = 1.f / sqrtf(block_sum(ss, scratch) / (float)dim + eps);
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
        const float g = zr[c];
        out[base + c] = x[base + c] * inv * w[c] * (g / (1.f + expf(-g)));
    }
}
