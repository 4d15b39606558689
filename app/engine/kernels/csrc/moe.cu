// Mixture-of-experts feed-forward on the GPU, with no host sync (so decode steps stay capturable):
//
//   moe_route    per token: the k best experts and their weights (softmax-then-top-k, renormalised or
//                not, as Qwen3-MoE; top-k-then-softmax, as GPT-OSS; or sigmoid scores chosen on score +
//                bias within the best expert groups, weighed by their scores times a routed scale, as
//                Nemotron-H (many groups) and Laguna (one)), optionally on tanh-capped logits; ties go
//                to the lower id, as a stable sort of the negated values does (moe/ops.py, the oracle).
//   moe_count, moe_offsets, moe_scatter
//                the (token, slot) pairs grouped by expert: counts, exclusive offsets, then each
//                pair's place in the grouped order (`order`) and its inverse (`where`).
//   moe_grouped_<fmt>
//                for expert e and output row r, one warp multiplies row r of expert e's stacked
//                weight [E, rows, cols] (GGUF block layout, quant.cuh) with the inputs of e's pairs,
//                MOE_T pairs at a time: each weight row is read once per MOE_T tokens of that
//                expert, the grouped product of prefill, and at decode (one token, k pairs) only the
//                k picked experts' rows are read, the per-expert GEMV.
//   moe_gated    act(gate) * up per pair (silu, GELU-tanh, or GPT-OSS's clamped swiglu), or relu(up)^2
//                for ungated experts (Nemotron-H's squared ReLU: no gate product at all).
//   moe_combine  per token, sum of its k pairs' outputs times their weights, in expert-id order
//                (the oracle's order, so a token's sum does not depend on the rest of the batch).
//
// Every kernel starts with after_previous_grid() (common.cuh): a decode graph launches them programmatically
// (pdl.py), and without the wait moe_route could read the router's logits while the product that writes
// them still runs (the previous replay's values: wrong experts, only in graphs).
#include "quant.cuh"

#define MOE_MAX_K 16
#define MOE_T 4

#define MOE_SOFTMAX_TOPK 0
#define MOE_TOPK_SOFTMAX 1
#define MOE_SIGMOID 2

// Expert e's router logit, tanh-capped where softcap > 0 (as moe/ops.py: tanh(l / cap) * cap).
__device__ __forceinline__ float moe_logit(const float* l, int e, float softcap) {
    return softcap > 0.f ? tanhf(l[e] / softcap) * softcap : l[e];
}

// What the top k are chosen on: the (capped) logit, or with MOE_SIGMOID the sigmoid score plus the
// expert's bias (nullable).
__device__ __forceinline__ float moe_choice(const float* l, int e, int mode, float softcap, const float* bias) {
    const float x = moe_logit(l, e, softcap);
    if (mode != MOE_SIGMOID) return x;
    const float score = 1.f / (1.f + expf(-x));
    return bias == nullptr ? score : score + bias[e];
}

// The router, a thread per token. `mode` MOE_SOFTMAX_TOPK, MOE_TOPK_SOFTMAX or MOE_SIGMOID; `softcap` 0: none.
// MOE_SIGMOID (Nemotron-H's DeepSeek-V3-style router, Laguna's with one group): the choice c = sigmoid(logit) +
// bias[e] (bias nullable); with n_groups > 1 only the experts of the topk_groups groups whose two best c sum
// highest compete (ties: the lower group); the k best c (ties: the lower id); weights the chosen scores,
// divided by their sum + 1e-20 when `normalize`, times `routed_scale`. Up to 64 groups and
// MOE_SIG_MAX_EXPERTS experts, whose choice values the thread computes once (local memory) for its k
// selection passes; the softmax modes (no bias, groups or scale) recompute theirs and take any expert count.
#define MOE_SIG_MAX_EXPERTS 512
#define MOE_MAX_GROUPS 64

extern "C" __global__ void moe_route(const float* __restrict__ logits, int n_tok, int n_exp, int k, int mode,
                                     int normalize, const float* __restrict__ bias, float softcap, float routed_scale,
                                     int n_groups, int topk_groups, int* __restrict__ chosen,
                                     float* __restrict__ weights) {
    after_previous_grid();
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_tok) return;
    const float* l = logits + (i64)t * n_exp;
    const bool cached = mode == MOE_SIGMOID;
    float choice[MOE_SIG_MAX_EXPERTS];
    if (cached)
        for (int e = 0; e < n_exp; ++e) choice[e] = moe_choice(l, e, mode, softcap, bias);
    unsigned long long allowed = ~0ull;  // bit g: group g competes
    const bool grouped = cached && n_groups > 1;
    const int per_group = grouped ? n_exp / n_groups : n_exp;
    if (grouped) {
        float sums[MOE_MAX_GROUPS];
        for (int g = 0; g < n_groups; ++g) {
            float b1 = -PADDOCK_INF, b2 = -PADDOCK_INF;
            for (int e = g * per_group; e < (g + 1) * per_group; ++e) {
                const float c = choice[e];
                if (c > b1) {
                    b2 = b1;
                    b1 = c;
                } else if (c > b2) {
                    b2 = c;
                }
            }
            sums[g] = per_group > 1 ? b1 + b2 : b1;
        }
        allowed = 0ull;
        for (int j = 0; j < topk_groups; ++j) {
            int best = -1;
            for (int g = 0; g < n_groups; ++g)
                if (!((allowed >> g) & 1ull) && (best < 0 || sums[g] > sums[best])) best = g;
            allowed |= 1ull << best;
        }
    }
    int idx[MOE_MAX_K];
    float val[MOE_MAX_K];
    for (int j = 0; j < k; ++j) {
        int best = -1;
        float best_v = 0.f;
        for (int e = 0; e < n_exp; ++e) {
            if (grouped && !((allowed >> (e / per_group)) & 1ull)) continue;
            bool taken = false;
            for (int i = 0; i < j; ++i) taken |= idx[i] == e;
            const float v = cached ? choice[e] : moe_choice(l, e, mode, softcap, bias);
            if (!taken && (best < 0 || v > best_v)) {
                best = e;
                best_v = v;
            }
        }
        idx[j] = best;
        val[j] = best_v;
    }
    float w[MOE_MAX_K], sum = 0.f;
    if (mode == MOE_SIGMOID) {  // the chosen experts' scores (without the bias), summing to routed_scale
        for (int j = 0; j < k; ++j) sum += (w[j] = 1.f / (1.f + expf(-moe_logit(l, idx[j], softcap))));
        for (int j = 0; j < k; ++j) w[j] = (normalize ? w[j] / (sum + 1e-20f) : w[j]) * routed_scale;
    } else if (mode == MOE_TOPK_SOFTMAX) {  // softmax over the k chosen logits
        for (int j = 0; j < k; ++j) sum += (w[j] = expf(val[j] - val[0]));
        for (int j = 0; j < k; ++j) w[j] /= sum;
    } else {  // softmax over every expert, then the chosen probabilities
        float all = 0.f;
        for (int e = 0; e < n_exp; ++e) all += expf(moe_logit(l, e, softcap) - val[0]);
        for (int j = 0; j < k; ++j) sum += (w[j] = expf(val[j] - val[0]) / all);
        if (normalize)
            for (int j = 0; j < k; ++j) w[j] /= sum;
    }
    for (int j = 0; j < k; ++j) {
        chosen[(i64)t * k + j] = idx[j];
        weights[(i64)t * k + j] = w[j];
    }
}

extern "C" __global__ void moe_count(const int* __restrict__ chosen, int n_pairs, int* __restrict__ counts) {
    after_previous_grid();
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p < n_pairs) atomicAdd(counts + chosen[p], 1);
}

// One thread: offsets[e] = sum of counts before e (offsets[n_exp] = all pairs); cursor = offsets.
extern "C" __global__ void moe_offsets(const int* __restrict__ counts, int n_exp, int* __restrict__ offsets,
                                       int* __restrict__ cursor) {
    after_previous_grid();
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    int total = 0;
    for (int e = 0; e < n_exp; ++e) {
        offsets[e] = cursor[e] = total;
        total += counts[e];
    }
    offsets[n_exp] = total;
}

extern "C" __global__ void moe_scatter(const int* __restrict__ chosen, int n_pairs, int* __restrict__ cursor,
                                       int* __restrict__ order, int* __restrict__ where) {
    after_previous_grid();
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= n_pairs) return;
    const int at = atomicAdd(cursor + chosen[p], 1);  // the order within an expert does not matter
    order[at] = p;
    where[p] = at;
}

// y[g, r] = W_e[r, :] . x[src(g), :] (+ bias_e[r]) for each grouped pair g of expert e = blockIdx.y;
// src(g) = order[g] / k (the pair's token) or g itself when the inputs are per pair (`x_per_pair`).
template <class Fmt>
__device__ __forceinline__ void moe_grouped(const u8* __restrict__ w, i64 expert_stride, i64 row_bytes, int n_rows,
                                            int n_cols, const float* __restrict__ x, int x_per_pair,
                                            const int* __restrict__ order, const int* __restrict__ offsets, int k,
                                            const float* __restrict__ bias, float* __restrict__ y) {
    after_previous_grid();
    const int e = blockIdx.y, lane = threadIdx.x & 31;
    const int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int begin = offsets[e], end = offsets[e + 1];
    if (r >= n_rows || begin == end) return;
    const u8* row = w + e * expert_stride + (i64)r * row_bytes;
    const int units = n_cols >> 5;
    for (int g0 = begin; g0 < end; g0 += MOE_T) {
        const int n = min(MOE_T, end - g0);
        const float* xs[MOE_T];
#pragma unroll
        for (int t = 0; t < MOE_T; ++t) {
            const int g = g0 + min(t, n - 1);
            xs[t] = x + (i64)(x_per_pair ? g : order[g] / k) * n_cols;
        }
        float acc[MOE_T];
#pragma unroll
        for (int t = 0; t < MOE_T; ++t) acc[t] = 0.f;
        for (int u = lane; u < units; u += 32) {
            Fmt f;
            f.load(row, u);
            const int xb = Fmt::x_base(u);
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                float w0[4], w1[4];
                f.get(q, w0, w1);
#pragma unroll
                for (int t = 0; t < MOE_T; ++t)
#pragma unroll
                    for (int i = 0; i < 4; ++i)
                        acc[t] += w0[i] * xs[t][xb + 4 * q + i] + w1[i] * xs[t][xb + Fmt::RUN1 + 4 * q + i];
            }
        }
#pragma unroll
        for (int t = 0; t < MOE_T; ++t) {
            float v = acc[t];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
            if (lane == 0 && t < n) y[(i64)(g0 + t) * n_rows + r] = v + (bias ? bias[(i64)e * n_rows + r] : 0.f);
        }
    }
}

#define MOE_GROUPED_KERNEL(SUFFIX, FMT)                                                                        \
    extern "C" __global__ void moe_grouped_##SUFFIX(                                                           \
        const u8* __restrict__ w, i64 expert_stride, i64 row_bytes, int n_rows, int n_cols,                    \
        const float* __restrict__ x, int x_per_pair, const int* __restrict__ order,                            \
        const int* __restrict__ offsets, int k, const float* __restrict__ bias, float* __restrict__ y) {       \
        moe_grouped<FMT>(w, expert_stride, row_bytes, n_rows, n_cols, x, x_per_pair, order, offsets, k, bias, y); \
    }

// One level more, so that PADDOCK_FORMAT is expanded (to q4_k, ...) before `##` pastes it into the name.
#define MOE_GROUPED_FORMAT(SUFFIX, FMT) MOE_GROUPED_KERNEL(SUFFIX, FMT)

#if defined(PADDOCK_ALL_VARIANTS)
PADDOCK_FORMATS(MOE_GROUPED_KERNEL)
#else
MOE_GROUPED_FORMAT(PADDOCK_FORMAT, PADDOCK_FORMAT_STRUCT)
#endif

// kind 0: silu(g) * u; kind 1: (clamp(u, +-limit) + 1) * g' * sigmoid(alpha g') with g' = min(g, limit);
// kind 2: relu(u)^2 (ungated: `gate` is not read); kind 3: gelu_tanh(g) * u (Gemma 4's experts), common.cuh's
// formula. The numbers are kernels/moe.py's ACTIVATION_KINDS.
extern "C" __global__ void moe_gated(const float* __restrict__ gate, const float* __restrict__ up, i64 n, int kind,
                                     float limit, float alpha, float* __restrict__ out) {
    after_previous_grid();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float u = up[i];
    if (kind == 2) {
        const float r = fmaxf(u, 0.f);
        out[i] = r * r;
        return;
    }
    const float g = gate[i];
    if (kind == 0) {
        out[i] = g / (1.f + expf(-g)) * u;
    } else if (kind == 3) {
        out[i] = gated_act<1>(g, u);
    } else {
        const float gc = fminf(g, limit), uc = fminf(fmaxf(u, -limit), limit);
        out[i] = (uc + 1.f) * (gc / (1.f + expf(-gc * alpha)));
    }
}

// out[t, c] = sum over t's k pairs, in expert-id order, of weights[t, j] * h[where[t k + j], c].
extern "C" __global__ void moe_combine(const float* __restrict__ h, const int* __restrict__ chosen,
                                       const float* __restrict__ weights, const int* __restrict__ where, int k,
                                       int n_cols, float* __restrict__ out) {
    after_previous_grid();
    const int t = blockIdx.x;
    int slot[MOE_MAX_K];
    for (int j = 0; j < k; ++j) slot[j] = j;
    for (int j = 1; j < k; ++j)  // insertion sort of the token's slots by expert id
        for (int i = j; i > 0 && chosen[(i64)t * k + slot[i - 1]] > chosen[(i64)t * k + slot[i]]; --i) {
            const int s = slot[i];
            slot[i] = slot[i - 1];
            slot[i - 1] = s;
        }
    for (int c = threadIdx.x; c < n_cols; c += blockDim.x) {
        float acc = 0.f;
        for (int j = 0; j < k; ++j) {
            const i64 q = (i64)t * k + slot[j];
            acc += h[(i64)where[q] * n_cols + c] * weights[q];
        }
        out[(i64)t * n_cols + c] = acc;
    }
}
