// Mixture-of-experts feed-forward on the GPU, with no host sync (so decode steps stay capturable):
//
//   moe_route    a warp per token: the k best experts and their weights (softmax-then-top-k, renormalised or
//                not, as Qwen3-MoE; top-k-then-softmax, as GPT-OSS; or sigmoid scores chosen on score +
//                bias within the best expert groups, weighed by their scores times a routed scale, as
//                Nemotron-H (many groups) and Laguna (one)), optionally on tanh-capped logits; ties go
//                to the lower id, as a stable sort of the negated values does (moe/ops.py, the oracle).
//   moe_offsets  one block (moe_plan): the (token, slot) pairs grouped by expert (counts, exclusive offsets, each
//                pair's place in the grouped order `order` and its inverse `where`) and the compact list
//                of the groups that have pairs (`active`: its length, then the ids in ascending order).
//                Many pairs: moe_count and moe_scatter spread the counting and the scatter over blocks. A few
//                tokens: moe_route_grouped routes and groups in one launch.
//   moe_grouped_<fmt>, moe_grouped_gated_<fmt>
//                per active group (blockIdx.y < active[0]: the grid is sized by min(slots, pairs), never by
//                the routing, and the blocks past the count exit at once) and output row, W_e[row] . x of
//                each of e's pairs, T in {4, 2, 1} pairs at a time: each weight row is read once per T
//                tokens of that expert, and at decode (one token, k pairs) only the k picked experts'
//                rows are read. The gated kernel reads gate and up rows against the same x loads and
//                writes act(gate) * up (the dense MLP's gemv_gated, per expert).
//   moe_gated    act(gate) * up per pair, for gate and up weights of different formats (the fused kernel
//                takes one); the ungated relu(up)^2 runs inside the up product (act 2).
//   moe_combine  per token, sum of its k pairs' outputs times their weights, in expert-id order
//                (the oracle's order, so a token's sum does not depend on the rest of the batch).
//   moe_pair_<fmt>, moe_pair_gated_<fmt>, moe_down_combine_<fmt>
//                a few tokens (kernels/moe.py's moe_few_tokens, after moe_route; no grouping): the products
//                per (token, slot) pair, and the down product fused with the combine (a block of k warps per
//                row tile and token, its sums in moe_combine's order: no [pairs, hidden] round trip).
//
// Every kernel starts with after_previous_grid() (common.cuh): a decode graph launches them programmatically
// (pdl.py), and without the wait moe_route could read the router's logits while the product that writes
// them still runs (the previous replay's values: wrong experts, only in graphs).
#include "gemv_int.cuh"  // quant.cuh, and int16 x: xq_group, xq_dot_runs

#define MOE_MAX_K 16
#define MOE_FULL 0xffffffffu

#define MOE_SOFTMAX_TOPK 0
#define MOE_TOPK_SOFTMAX 1
#define MOE_SIGMOID 2

// -- routing ---------------------------------------------------------------------------------------------

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

// The warp's best (value, id) candidate, in every lane: the higher value, on a tie the lower id; id -1 (no
// candidate) loses to any. The xor tree gives each lane a result; lane 0's is broadcast so that the lanes
// agree even where values do not order (NaN).
__device__ __forceinline__ void moe_warp_best(float& v, int& id) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_xor_sync(MOE_FULL, v, off);
        const int oi = __shfl_xor_sync(MOE_FULL, id, off);
        if (oi >= 0 && (id < 0 || ov > v || (ov == v && oi < id))) {
            v = ov;
            id = oi;
        }
    }
    v = __shfl_sync(MOE_FULL, v, 0);
    id = __shfl_sync(MOE_FULL, id, 0);
}

// The router, a warp per token: lane l holds the choice values of experts l, l + 32, ... (registers), and
// each of the k picks is one pass over them plus a warp-wide argmax; pick j lands in lane j, which then
// computes its weight (sums over the picks and over all experts are warp sums). `mode` MOE_SOFTMAX_TOPK,
// MOE_TOPK_SOFTMAX or MOE_SIGMOID; `softcap` 0: none. MOE_SIGMOID (Nemotron-H's DeepSeek-V3-style router,
// Laguna's with one group): the choice c = sigmoid(logit) + bias[e] (bias nullable); with n_groups > 1 only
// the experts of the topk_groups groups whose two best c sum highest compete (ties: the lower group); the k
// best c (ties: the lower id); weights the chosen scores, divided by their sum + 1e-20 when `normalize`,
// times `routed_scale`. Up to MOE_ROUTE_PER_LANE * 32 experts in up to 64 groups.
#define MOE_ROUTE_PER_LANE 32
#define MOE_MAX_GROUPS 64

// The topk_groups best groups as a bit mask (bit g: group g competes), the same in every lane. Lane l
// scores groups l and l + 32 (the sum of their two best choices, or the best one of a one-expert group).
__device__ __forceinline__ unsigned long long moe_route_groups(const float* l, int n_exp, int n_groups,
                                                               int topk_groups, float softcap,
                                                               const float* bias) {
    const int lane = threadIdx.x & 31, per_group = n_exp / n_groups;
    float sums[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int g = lane + 32 * h;
        float b1 = -PADDOCK_INF, b2 = -PADDOCK_INF;
        for (int e = g * per_group; g < n_groups && e < (g + 1) * per_group; ++e) {
            const float c = moe_choice(l, e, MOE_SIGMOID, softcap, bias);
            if (c > b1) {
                b2 = b1;
                b1 = c;
            } else if (c > b2) {
                b2 = c;
            }
        }
        sums[h] = per_group > 1 ? b1 + b2 : b1;
    }
    unsigned long long allowed = 0ull;
    for (int j = 0; j < topk_groups; ++j) {
        float v = 0.f;
        int id = -1;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int g = lane + 32 * h;
            if (g < n_groups && !((allowed >> g) & 1ull) && (id < 0 || sums[h] > v)) {
                v = sums[h];
                id = g;
            }
        }
        moe_warp_best(v, id);
        allowed |= 1ull << id;
    }
    return allowed;
}

// The router's arguments after the logits (moe_route's, kernels/moe.py's order).
struct MoeRouting {
    int n_exp, k, mode, normalize;
    const float* bias;
    float softcap, routed_scale;
    int n_groups, topk_groups;
    int logit_stride;  // floats from one token's logits to the next: n_exp, or more where the router's product
                       // carries other columns (Qwen3.5-MoE's shared-expert gate beside them)
};

// Token t's picks into chosen[t k ..] and weights[t k ..], by one warp (all its lanes).
__device__ __forceinline__ void moe_route_token(const float* __restrict__ logits, int t, const MoeRouting& rt,
                                                int* chosen, float* __restrict__ weights) {
    const int lane = threadIdx.x & 31, n_exp = rt.n_exp, k = rt.k, mode = rt.mode;
    const float softcap = rt.softcap, * bias = rt.bias;
    const float* l = logits + (i64)t * rt.logit_stride;
    const int n_groups = rt.n_groups;
    const bool grouped = mode == MOE_SIGMOID && n_groups > 1;
    const unsigned long long allowed =
        grouped ? moe_route_groups(l, n_exp, n_groups, rt.topk_groups, softcap, bias) : ~0ull;
    const int per_group = grouped ? n_exp / n_groups : n_exp;
    float v[MOE_ROUTE_PER_LANE];
    u32 live = 0u;  // bit i: expert lane + 32 i competes and is not chosen yet
#pragma unroll
    for (int i = 0; i < MOE_ROUTE_PER_LANE; ++i) {
        const int e = lane + 32 * i;
        v[i] = 0.f;
        if (32 * i >= n_exp) break;  // warp-uniform: the passes below walk only the slots in use
        if (e < n_exp && (allowed >> (e / per_group)) & 1ull) {
            v[i] = moe_choice(l, e, mode, softcap, bias);
            live |= 1u << i;
        }
    }
    int mine = -1;  // lane j: the j-th pick and its choice value
    float mine_v = 0.f;
    for (int j = 0; j < k; ++j) {
        float bv = 0.f;
        int be = -1;
#pragma unroll
        for (int i = 0; i < MOE_ROUTE_PER_LANE; ++i) {  // ascending ids: a tie keeps the lower
            if (32 * i >= n_exp) break;
            if (((live >> i) & 1u) && (be < 0 || v[i] > bv)) {
                bv = v[i];
                be = lane + 32 * i;
            }
        }
        moe_warp_best(bv, be);
        if (be >= 0 && (be & 31) == lane) live &= ~(1u << (be >> 5));
        if (lane == j) {
            mine = be;
            mine_v = bv;
        }
    }
    const float top = __shfl_sync(MOE_FULL, mine_v, 0);
    float w = 0.f;
    if (mode == MOE_SIGMOID) {  // the chosen experts' scores (without the bias), summing to routed_scale
        w = lane < k ? 1.f / (1.f + expf(-moe_logit(l, mine, softcap))) : 0.f;
        const float sum = warp_sum(w);
        w = (rt.normalize ? w / (sum + 1e-20f) : w) * rt.routed_scale;
    } else if (mode == MOE_TOPK_SOFTMAX) {  // softmax over the k chosen logits
        w = lane < k ? expf(mine_v - top) : 0.f;
        w /= warp_sum(w);
    } else {  // softmax over every expert (v holds every logit), then the chosen probabilities
        float all = 0.f;
#pragma unroll
        for (int i = 0; i < MOE_ROUTE_PER_LANE; ++i) {
            if (32 * i >= n_exp) break;
            if (lane + 32 * i < n_exp) all += expf(v[i] - top);
        }
        all = warp_sum(all);
        w = lane < k ? expf(mine_v - top) / all : 0.f;
        const float sum = warp_sum(w);
        if (rt.normalize) w /= sum;
    }
    if (lane < k) {
        chosen[(i64)t * k + lane] = mine;
        weights[(i64)t * k + lane] = w;
    }
}

extern "C" __global__ void moe_route(const float* __restrict__ logits, int n_tok, int n_exp, int k, int mode,
                                     int normalize, const float* __restrict__ bias, float softcap, float routed_scale,
                                     int n_groups, int topk_groups, int logit_stride, int* __restrict__ chosen,
                                     float* __restrict__ weights) {
    after_previous_grid();
    const MoeRouting rt{n_exp, k, mode, normalize, bias, softcap, routed_scale, n_groups, topk_groups, logit_stride};
    const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t < n_tok) moe_route_token(logits, t, rt, chosen, weights);  // the whole warp
}

// -- grouping ----------------------------------------------------------------------------------------------

// Many pairs only (moe_offsets counts a few itself): counts[g] += pairs of group g (counts zeroed first).
extern "C" __global__ void moe_count(const int* __restrict__ groups, int n_pairs, int* __restrict__ counts) {
    after_previous_grid();
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p < n_pairs) atomicAdd(counts + groups[p], 1);
}

#define MOE_PLAN_MAX_GROUPS 2048
#define MOE_PLAN_THREADS 1024  // kernels/moe.py's PLAN_THREADS: at most 64 registers a thread (the bound says so)

// One block. Counts the pairs per group (in shared memory; or reads `counts` from moe_count where not
// null), offsets[g] = pairs before group g (offsets[n_groups] = all pairs), and the active list of groups
// below n_slots with pairs: active[0] = how many, active[1 + i] = the i-th in ascending order (group n_slots,
// where present, holds the skipped pairs: never run). Then either the scatter itself (`order` not null:
// order[at] = p and where[p] = at, p's place `at` in its group taken by a shared-memory atomic; the order
// within a group does not matter) or the cursor moe_scatter starts from. Up to MOE_PLAN_MAX_GROUPS groups.
__device__ __forceinline__ void moe_plan(const int* groups, int n_pairs, const int* __restrict__ counts, int n_groups,
                                         int n_slots, int* __restrict__ offsets, int* __restrict__ cursor,
                                         int* __restrict__ active, int* __restrict__ order, int* __restrict__ where) {
    __shared__ int count[MOE_PLAN_MAX_GROUPS];
    __shared__ int start[MOE_PLAN_MAX_GROUPS];
    for (int g = threadIdx.x; g < n_groups; g += blockDim.x) count[g] = counts != nullptr ? counts[g] : 0;
    __syncthreads();
    if (counts == nullptr) {
        for (int p = threadIdx.x; p < n_pairs; p += blockDim.x) atomicAdd(count + groups[p], 1);
        __syncthreads();
    }
    if (threadIdx.x < 32) {  // warp 0 scans: lane l takes a run of consecutive groups
        const int lane = threadIdx.x, per = (n_groups + 31) / 32, g0 = min(lane * per, n_groups);
        const int g1 = min(g0 + per, n_groups);
        int pairs = 0, busy = 0;
        for (int g = g0; g < g1; ++g) {
            pairs += count[g];
            busy += g < n_slots && count[g] > 0;
        }
        int pairs_before = pairs, busy_before = busy;  // inclusive scans, then made exclusive
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const int a = __shfl_up_sync(MOE_FULL, pairs_before, off), b = __shfl_up_sync(MOE_FULL, busy_before, off);
            if (lane >= off) {
                pairs_before += a;
                busy_before += b;
            }
        }
        pairs_before -= pairs;
        busy_before -= busy;
        for (int g = g0; g < g1; ++g) {
            start[g] = offsets[g] = pairs_before;
            if (order == nullptr) cursor[g] = pairs_before;
            pairs_before += count[g];
            if (g < n_slots && count[g] > 0) active[1 + busy_before++] = g;
        }
        if (lane == 31) {
            offsets[n_groups] = pairs_before;
            active[0] = busy_before;
        }
    }
    __syncthreads();
    if (order != nullptr)
        for (int p = threadIdx.x; p < n_pairs; p += blockDim.x) {
            const int at = atomicAdd(start + groups[p], 1);
            order[at] = p;
            where[p] = at;
        }
}

extern "C" __global__ void __launch_bounds__(MOE_PLAN_THREADS)
    moe_offsets(const int* __restrict__ groups, int n_pairs, const int* __restrict__ counts, int n_groups, int n_slots,
                int* __restrict__ offsets, int* __restrict__ cursor, int* __restrict__ active, int* __restrict__ order,
                int* __restrict__ where) {
    after_previous_grid();
    moe_plan(groups, n_pairs, counts, n_groups, n_slots, offsets, cursor, active, order, where);
}

// A decode step's router and grouping in one launch (one block): its warps route the tokens (moe_route_token),
// then the block groups the pairs by expert (moe_plan with groups = chosen). The grouping reads `chosen` after
// the barrier, which makes the block's global writes visible to all its threads.
extern "C" __global__ void __launch_bounds__(MOE_PLAN_THREADS)
    moe_route_grouped(const float* __restrict__ logits, int n_tok, int n_exp, int k, int mode, int normalize,
                      const float* __restrict__ bias, float softcap, float routed_scale, int n_groups, int topk_groups,
                      int logit_stride, int* chosen, float* __restrict__ weights, int* __restrict__ offsets, int* __restrict__ active,
                      int* __restrict__ order, int* __restrict__ where) {
    after_previous_grid();
    const MoeRouting rt{n_exp, k, mode, normalize, bias, softcap, routed_scale, n_groups, topk_groups, logit_stride};
    for (int t = threadIdx.x >> 5; t < n_tok; t += blockDim.x >> 5) moe_route_token(logits, t, rt, chosen, weights);
    __syncthreads();
    moe_plan(chosen, n_tok * k, nullptr, n_exp, n_exp, offsets, nullptr, active, order, where);
}

extern "C" __global__ void moe_scatter(const int* __restrict__ groups, int n_pairs, int* __restrict__ cursor,
                                       int* __restrict__ order, int* __restrict__ where) {
    after_previous_grid();
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= n_pairs) return;
    const int at = atomicAdd(cursor + groups[p], 1);  // the order within an expert does not matter
    order[at] = p;
    where[p] = at;
}

// -- grouped products --------------------------------------------------------------------------------------

// The activations: kind 0: silu(g) * u; kind 1: (clamp(u, +-limit) + 1) * g' * sigmoid(alpha g') with
// g' = min(g, limit) (GPT-OSS); kind 2: relu(u)^2 (ungated: g unused); kind 3: gelu_tanh(g) * u (Gemma 4's
// experts), common.cuh's formula. The numbers are kernels/moe.py's ACTIVATION_KINDS.
__device__ __forceinline__ float moe_act(int kind, float g, float u, float limit, float alpha) {
    if (kind == 2) {
        const float r = fmaxf(u, 0.f);
        return r * r;
    }
    if (kind == 0) return g / (1.f + expf(-g)) * u;
    if (kind == 3) return gated_act<1>(g, u);
    const float gc = fminf(g, limit), uc = fminf(fmaxf(u, -limit), limit);
    return (uc + 1.f) * (gc / (1.f + expf(-gc * alpha)));
}

// Rows of each weight a lane group reads at once (kernels/moe.py's ROWS). A build define for A/B runs
// (PADDOCK_KERNEL_DEFINES=MOE_R=4): every product walks its rows grid-stride, so the grids kernels/moe.py
// sizes for ROWS stay correct, with blocks to spare. More rows a lane group puts more weight bytes in flight
// per warp: at decode a warp's whole pass is one round of loads (a 2,048-column row is one unit pair a lane).
// Its cost (nvcc 13, sm_90): the gated Q4_K build takes 252 registers a thread at 4 against 127 at 2, so half
// the warps are resident and the bytes in flight per multiprocessor stay about the same; the down products'
// builds go from 85 to 128. Measure before making it a default.
#ifndef MOE_R
#define MOE_R 2
#endif
#define MOE_WARPS 4  // warps per block (kernels/moe.py's WARPS)
// The most pairs of one expert a pass over its rows takes (4, 2 or 1; one build each, -D from kernels/moe.py).
// The registers of the widest pass are the kernel's: at 4 the gated Q4_K build takes 255 a thread, at 1 128,
// so a decode step (an expert has one pair) runs the 1 build with twice the warps resident.
#ifndef MOE_TMAX
#define MOE_TMAX 4
#endif

// One 32-weight unit u of NR rows against T tokens' x (float32, from L1): acc[t][r] += W[r, unit] . x_t.
// Per run, the codes of raw() times x, then the format's (a, b) once (quant.cuh), as gemv.cuh does.
template <class Fmt, int NR, int T>
__device__ __forceinline__ void moe_unit(const Fmt (&f)[NR], int u, const float* const (&xs)[T],
                                         float (&acc)[T][NR]) {
    const int xb = Fmt::x_base(u);
    float p0[T][NR], p1[T][NR], X0[T], X1[T];
#pragma unroll
    for (int t = 0; t < T; ++t) {
        X0[t] = X1[t] = 0.f;
#pragma unroll
        for (int r = 0; r < NR; ++r) p0[t][r] = p1[t][r] = 0.f;
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        float4 xa[T], xc[T];
#pragma unroll
        for (int t = 0; t < T; ++t) {
            xa[t] = __ldg(reinterpret_cast<const float4*>(xs[t] + xb + 4 * k));
            xc[t] = __ldg(reinterpret_cast<const float4*>(xs[t] + xb + Fmt::RUN1 + 4 * k));
            if (Fmt::AFFINE) {
                X0[t] += (xa[t].x + xa[t].y) + (xa[t].z + xa[t].w);
                X1[t] += (xc[t].x + xc[t].y) + (xc[t].z + xc[t].w);
            }
        }
#pragma unroll
        for (int r = 0; r < NR; ++r) {
            float c0[4], c1[4];
            f[r].raw(k, c0, c1);
#pragma unroll
            for (int t = 0; t < T; ++t) {
                float a = p0[t][r], b = p1[t][r];
                a = fmaf(c0[0], xa[t].x, fmaf(c0[1], xa[t].y, fmaf(c0[2], xa[t].z, fmaf(c0[3], xa[t].w, a))));
                b = fmaf(c1[0], xc[t].x, fmaf(c1[1], xc[t].y, fmaf(c1[2], xc[t].z, fmaf(c1[3], xc[t].w, b))));
                p0[t][r] = a;
                p1[t][r] = b;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < NR; ++r) {
        float a0, b0, a1, b1;
        f[r].coef(a0, b0, a1, b1);
#pragma unroll
        for (int t = 0; t < T; ++t)
            acc[t][r] += Fmt::AFFINE ? fmaf(a0, p0[t][r], b0 * X0[t]) + fmaf(a1, p1[t][r], b1 * X1[t])
                                     : p0[t][r] + p1[t][r];
    }
}

// Inputs as int16 codes (moe_xq), from one row on: `codes` n_cols codes a row in column order, `ds` the (d, sum)
// of each 16-column group (gemv_int.cuh's xq_group), n_cols / 16 a row.
struct MoeXq {
    const u16* codes;
    const float2* ds;
};

// moe_unit over int16 x: per run, the integer dot of the weight codes and x codes (dp2a, gemv_int.cuh's
// xq_dot_runs), then w = a code + b gives a * d * dot + b * sum. Two-thirds fewer issue slots per weight than the
// float32-x unit (which converts each code and multiplies it by a float x from L1 per token): at decode batch sizes
// that unit kept the MoE products near the issue limit, well under HBM's bandwidth.
template <class Fmt, int NR, int T>
__device__ __forceinline__ void moe_unit(const Fmt (&f)[NR], int u, const MoeXq (&xs)[T], float (&acc)[T][NR]) {
    const int xb = Fmt::x_base(u);
#pragma unroll
    for (int t = 0; t < T; ++t) {
        const uint4* a = reinterpret_cast<const uint4*>(xs[t].codes + xb);
        const uint4* c = reinterpret_cast<const uint4*>(xs[t].codes + xb + Fmt::RUN1);
        const uint4 alo = __ldg(a), ahi = __ldg(a + 1), clo = __ldg(c), chi = __ldg(c + 1);
        const float2 ga = __ldg(xs[t].ds + (xb >> 4)), gc = __ldg(xs[t].ds + ((xb + Fmt::RUN1) >> 4));
#pragma unroll
        for (int r = 0; r < NR; ++r) {
            int i0 = 0, i1 = 0;
            xq_dot_runs(f[r], alo, ahi, clo, chi, i0, i1);
            float a0, b0, a1, b1;
            f[r].icoef(a0, b0, a1, b1);
            acc[t][r] += fmaf(a0 * ga.x, (float)i0, b0 * ga.y) + fmaf(a1 * gc.x, (float)i1, b1 * gc.y);
        }
    }
}

// acc[t][r] = W[rows[r]] . x_t, summed over the `width` lanes of this lane's group (sl: its place in the
// group); X an input row, float32 (const float*) or int16 codes (MoeXq). A lane takes two neighbouring units
// at a time (2 sl, 2 sl + 1, then 2 width further on), both loaded before either is multiplied: every row's
// next two units in flight, and for the k-quants one block header (read and decoded once: the compiler merges
// the two units' identical loads) and 32 contiguous quant bytes, as gemv_int.cuh's U = 2.
template <class Fmt, int NR, int T, class X>
__device__ __forceinline__ void moe_dot(const u8* const (&rows)[NR], int n_cols, const X (&xs)[T], int sl, int width,
                                        float (&acc)[T][NR]) {
    const int units = n_cols >> 5;
#pragma unroll
    for (int t = 0; t < T; ++t)
#pragma unroll
        for (int r = 0; r < NR; ++r) acc[t][r] = 0.f;
    for (int u = 2 * sl; u < units; u += 2 * width) {
        const bool second = u + 1 < units;
        Fmt f0[NR], f1[NR];
#pragma unroll
        for (int r = 0; r < NR; ++r) f0[r].load(rows[r], u);
        if (second)
#pragma unroll
            for (int r = 0; r < NR; ++r) f1[r].load(rows[r], u + 1);
        moe_unit<Fmt, NR, T>(f0, u, xs, acc);
        if (second) moe_unit<Fmt, NR, T>(f1, u + 1, xs, acc);
    }
#pragma unroll
    for (int t = 0; t < T; ++t)
#pragma unroll
        for (int r = 0; r < NR; ++r)
            for (int off = width >> 1; off > 0; off >>= 1) acc[t][r] += __shfl_xor_sync(MOE_FULL, acc[t][r], off);
}

// The weights a grouped product reads: G of them (1: one weight; 2: gate then up) of one format, stacked
// [E, rows, cols] with the same strides, their [E, rows] biases (nullable), and what is written:
// act >= 0: moe_act(act, first, second) (a single weight: moe_act(act, -, it)), else the product itself.
struct MoeWeights {
    const u8* w[2];
    const float* bias[2];
    i64 expert_stride, row_bytes;
    int n_rows, n_cols, act;
    float limit, alpha;
};

// Pairs g0 .. g0 + T - 1 of expert e (their input rows xs), rows row0 .. row0 + R - 1 of each weight, by one
// lane group; output rows g0 .. g0 + T - 1 of y.
template <class Fmt, int G, int T, class X>
__device__ __forceinline__ void moe_pairs(const MoeWeights& mw, int e, int row0, bool writes, const X (&xs)[T], int g0,
                                          int sl, int width, float* __restrict__ y) {
    constexpr int R = MOE_R;
    const u8* rows[G * R];
#pragma unroll
    for (int m = 0; m < G; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r)
            rows[m * R + r] = mw.w[m] + e * mw.expert_stride + (i64)min(row0 + r, mw.n_rows - 1) * mw.row_bytes;
    float acc[T][G * R];
    moe_dot<Fmt, G * R, T>(rows, mw.n_cols, xs, sl, width, acc);
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int row = row0 + r;
        if (!writes || sl != r % width || row >= mw.n_rows) continue;  // every lane of the group holds the sums
        float b[G];
#pragma unroll
        for (int m = 0; m < G; ++m) b[m] = mw.bias[m] != nullptr ? mw.bias[m][(i64)e * mw.n_rows + row] : 0.f;
#pragma unroll
        for (int t = 0; t < T; ++t) {
            const float first = acc[t][r] + b[0], last = acc[t][(G - 1) * R + r] + b[G - 1];
            y[(i64)(g0 + t) * mw.n_rows + row] = mw.act >= 0 ? moe_act(mw.act, first, last, mw.limit, mw.alpha) : first;
        }
    }
}

// How a product's lanes share out the rows of one expert: a warp is 32 / width lane groups of `width` lanes
// (the largest power of two up to half the row's units, at most 32: a lane's two units loaded at once), each
// group MOE_R rows of each weight; `sub` is this lane's group in its warp and `sl` its place in the group.
struct MoeLanes {
    int width, per_warp, sub, sl, row_groups;
};

__device__ __forceinline__ MoeLanes moe_lanes(int n_rows, int n_cols) {
    const int units = n_cols >> 5, lane = threadIdx.x & 31;
    int width = 32;
    while (width > 1 && 2 * width > units) width >>= 1;
    return {width, 32 / width, lane / width, lane % width, (n_rows + MOE_R - 1) / MOE_R};
}

// The rows of expert e's G weights from row group `first` (a warp's) on their way to L2, while the caller
// reads what it needs before the products.
template <int G>
__device__ __forceinline__ void moe_prefetch(const MoeWeights& mw, int e, const MoeLanes& ln, int first) {
    if (first < ln.row_groups)
#pragma unroll
        for (int m = 0; m < G; ++m)
            prefetch_l2_warp(mw.w[m] + e * mw.expert_stride + (i64)first * MOE_R * mw.row_bytes,
                             (i64)(min(min(first + ln.per_warp, ln.row_groups) * MOE_R, mw.n_rows) - first * MOE_R) *
                                 mw.row_bytes);
}

// Row r of a grouped product's inputs, float32 rows (const float*) or int16 codes (MoeXq): the same type.
__device__ __forceinline__ const float* moe_row(const float* x, i64 r, int n_cols) { return x + r * n_cols; }
__device__ __forceinline__ MoeXq moe_row(const MoeXq& x, i64 r, int n_cols) {
    return {x.codes + r * n_cols, x.ds + r * (n_cols >> 4)};
}

// Grouped pairs g .. g + T - 1's input rows: order[g] / k (their tokens), or g itself when the inputs are per pair.
template <int T, class X>
__device__ __forceinline__ void moe_sources(const X& x, int n_cols, int x_per_pair, const int* order, int k, int g,
                                            X (&xs)[T]) {
#pragma unroll
    for (int t = 0; t < T; ++t) xs[t] = moe_row(x, x_per_pair ? g + t : order[g + t] / k, n_cols);
}

// y[g, row] for each grouped pair g of the active group blockIdx.y (active[1 + blockIdx.y]; blocks past
// active[0] exit); the pair's input row src(g) = order[g] / k (its token) or g itself when the inputs are
// per pair (`x_per_pair`). The lanes as moe_lanes; the row groups of the block's warps are walked
// grid-stride, so any grid.x is correct. The loops are warp-uniform (shuffles): a lane group past the last
// row computes clamped rows and writes nothing.
template <class Fmt, int G, class X>
__device__ __forceinline__ void moe_grouped(const MoeWeights& mw, const X x, int x_per_pair,
                                            const int* __restrict__ order, const int* __restrict__ offsets,
                                            const int* __restrict__ active, int k, float* __restrict__ y) {
    after_previous_grid();
    const int n_active = active[0], e = active[1 + blockIdx.y];  // one round trip (past n_active: unused)
    if ((int)blockIdx.y >= n_active) return;
    const MoeLanes ln = moe_lanes(mw.n_rows, mw.n_cols);
    const int warps = blockDim.x >> 5, first = (blockIdx.x * warps + (threadIdx.x >> 5)) * ln.per_warp;
    moe_prefetch<G>(mw, e, ln, first);  // the warp's first rows, while the expert's offsets are read
    const int begin = offsets[e], end = offsets[e + 1];
    for (int w0 = first; w0 < ln.row_groups; w0 += gridDim.x * warps * ln.per_warp) {
        const int rg = w0 + ln.sub, row0 = min(rg, ln.row_groups - 1) * MOE_R;
        const bool writes = rg < ln.row_groups;
        int g = begin;
        if constexpr (MOE_TMAX >= 4)
            for (; g + 4 <= end; g += 4) {
                X xs[4];
                moe_sources<4>(x, mw.n_cols, x_per_pair, order, k, g, xs);
                moe_pairs<Fmt, G, 4>(mw, e, row0, writes, xs, g, ln.sl, ln.width, y);
            }
        if constexpr (MOE_TMAX >= 2)
            for (; g + 2 <= end; g += 2) {
                X xs[2];
                moe_sources<2>(x, mw.n_cols, x_per_pair, order, k, g, xs);
                moe_pairs<Fmt, G, 2>(mw, e, row0, writes, xs, g, ln.sl, ln.width, y);
            }
        for (; g < end; ++g) {
            X xs[1];
            moe_sources<1>(x, mw.n_cols, x_per_pair, order, k, g, xs);
            moe_pairs<Fmt, G, 1>(mw, e, row0, writes, xs, g, ln.sl, ln.width, y);
        }
    }
}

// -- a few tokens: products per (token, slot), the down product and the combine in one ---------------------
//
// At up to kernels/moe.py's FUSED_DECODE_MAX_TOKENS tokens the pairs are few and their experts nearly all
// distinct, so nothing is gained by grouping them by expert: moe_route's choices index the products directly.

// y[p, row] for pair p = blockIdx.y (token p / k, expert chosen[p]), in pair order: the grouped kernels'
// rows and lanes (moe_grouped), one pair a block row.
template <class Fmt, int G>
__device__ __forceinline__ void moe_per_pair(const MoeWeights& mw, const float* __restrict__ x,
                                             const int* __restrict__ chosen, int k, float* __restrict__ y) {
    after_previous_grid();
    const int p = blockIdx.y, e = chosen[p];
    const MoeLanes ln = moe_lanes(mw.n_rows, mw.n_cols);
    const int warps = blockDim.x >> 5, first = (blockIdx.x * warps + (threadIdx.x >> 5)) * ln.per_warp;
    moe_prefetch<G>(mw, e, ln, first);
    const float* const xs[1] = {x + (i64)(p / k) * mw.n_cols};
    for (int w0 = first; w0 < ln.row_groups; w0 += gridDim.x * warps * ln.per_warp) {
        const int rg = w0 + ln.sub;
        moe_pairs<Fmt, G, 1>(mw, e, min(rg, ln.row_groups - 1) * MOE_R, rg < ln.row_groups, xs, p, ln.sl, ln.width,
                             y);
    }
}

// Slot j's place among a token's k picks (`picks`: its chosen ids) in expert-id order, the order the combines add
// them in (the oracle's, so that a token's sum does not depend on the rest of the batch; a token picks an
// expert once, the index breaks ties all the same).
__device__ __forceinline__ int moe_rank(const int* picks, int k, int j) {
    const int e = picks[j];
    int rank = 0;
    for (int i = 0; i < k; ++i) rank += picks[i] < e || (picks[i] == e && i < j);
    return rank;
}

// Pair q's routing weight, times its expert's factor where expert_scale is given (Gemma 4: as moe/ops.py
// scales the routed weights).
__device__ __forceinline__ float moe_pair_weight(const float* weights, const float* expert_scale, const int* chosen,
                                                 i64 q) {
    return expert_scale != nullptr ? weights[q] * expert_scale[chosen[q]] : weights[q];
}

#define MOE_DC_ROWS (32 * MOE_R)  // the most rows a warp of moe_down_combine covers (lane groups of one lane)

// out[t, rows] = sum over token t = blockIdx.y's k pairs, in expert-id order, of weights[q] (times
// expert_scale[e] where given) * (W_e[rows] . act[q] + bias_e[rows]): moe_grouped's down product and
// moe_combine in one launch, with no [pairs, hidden] round trip. A block is k warps: warp j takes the pair
// whose expert is the j-th smallest of the token's (moe_combine's rank) for a tile of 32 / width lane groups
// x MOE_R rows (moe_lanes), puts its dots in shared memory, and the block sums them in rank order, as
// moe_combine does (the same sums as the two kernels, no atomics). Tiles grid-stride over blockIdx.x.
// With `shared` (not nullptr), a shared expert's output row joins the sum after the pairs, times the sigmoid of
// its token's gate logit (shared_logit[t * logit_stride]: Qwen3.5-MoE, Qwen3-Next), as output_gate_sigmoid and
// the add after it would: the product rounded before the add (__fmul_rn: never contracted into an FMA).
template <class Fmt>
__device__ __forceinline__ void moe_down_combine(const MoeWeights& mw, const float* __restrict__ act,
                                                 const int* __restrict__ chosen, const float* __restrict__ weights,
                                                 const float* __restrict__ expert_scale, int k,
                                                 const float* __restrict__ shared,
                                                 const float* __restrict__ shared_logit, i64 logit_stride,
                                                 float* __restrict__ out) {
    __shared__ int pair_of[MOE_MAX_K];
    __shared__ float scale[MOE_MAX_K];
    __shared__ float part[MOE_MAX_K][MOE_DC_ROWS];
    after_previous_grid();
    const int t = blockIdx.y, j = threadIdx.x >> 5;
    if ((int)threadIdx.x < k) {
        const i64 q = (i64)t * k + threadIdx.x;
        const int rank = moe_rank(chosen + (i64)t * k, k, threadIdx.x);
        pair_of[rank] = (int)q;
        scale[rank] = moe_pair_weight(weights, expert_scale, chosen, q);
    }
    __syncthreads();
    const int q = pair_of[j], e = chosen[q];
    const MoeLanes ln = moe_lanes(mw.n_rows, mw.n_cols);
    moe_prefetch<1>(mw, e, ln, blockIdx.x * ln.per_warp);
    const float* const xs[1] = {act + (i64)q * mw.n_cols};
    const int tile_rows = ln.per_warp * MOE_R;
    for (int tile = blockIdx.x * ln.per_warp; tile < ln.row_groups; tile += gridDim.x * ln.per_warp) {
        const int rg = tile + ln.sub, row0 = min(rg, ln.row_groups - 1) * MOE_R;  // block-uniform loop
        const u8* rows[MOE_R];
#pragma unroll
        for (int r = 0; r < MOE_R; ++r)
            rows[r] = mw.w[0] + e * mw.expert_stride + (i64)min(row0 + r, mw.n_rows - 1) * mw.row_bytes;
        float acc[1][MOE_R];
        moe_dot<Fmt, MOE_R, 1>(rows, mw.n_cols, xs, ln.sl, ln.width, acc);
#pragma unroll
        for (int r = 0; r < MOE_R; ++r)
            if (ln.sl == r % ln.width) {  // every lane of the group holds the sums
                const float b = mw.bias[0] != nullptr ? mw.bias[0][(i64)e * mw.n_rows + min(row0 + r, mw.n_rows - 1)] : 0.f;
                part[j][ln.sub * MOE_R + r] = acc[0][r] + b;
            }
        __syncthreads();
        for (int i = threadIdx.x; i < tile_rows; i += blockDim.x) {
            const int row = tile * MOE_R + i;
            if (row >= mw.n_rows) continue;
            float sum = 0.f;
            for (int s = 0; s < k; ++s) sum += part[s][i] * scale[s];
            if (shared != nullptr) {
                const float g = shared_logit[(i64)t * logit_stride];
                sum += __fmul_rn(shared[(i64)t * mw.n_rows + row], 1.f / (1.f + expf(-g)));
            }
            out[(i64)t * mw.n_rows + row] = sum;
        }
        __syncthreads();  // the next tile's dots overwrite part
    }
}

// One weight: y[g, r] = W_e[r, :] . x[src(g), :] (+ bias_e[r]), or with act 2 relu of it squared.
#define MOE_GROUPED_KERNEL(SUFFIX, FMT)                                                                         \
    extern "C" __global__ void __launch_bounds__(32 * MOE_WARPS) moe_grouped_##SUFFIX(                          \
        const u8* __restrict__ w, i64 expert_stride, i64 row_bytes, int n_rows, int n_cols,                     \
        const float* __restrict__ x, int x_per_pair, const int* __restrict__ order,                             \
        const int* __restrict__ offsets, const int* __restrict__ active, int k, const float* __restrict__ bias, \
        int act, float* __restrict__ y) {                                                                       \
        const MoeWeights mw{{w, w}, {bias, bias}, expert_stride, row_bytes, n_rows, n_cols, act, 0.f, 0.f};    \
        moe_grouped<FMT, 1, const float*>(mw, x, x_per_pair, order, offsets, active, k, y);                     \
    }                                                                                                           \
    extern "C" __global__ void __launch_bounds__(32 * MOE_WARPS) moe_grouped_gated_##SUFFIX(                    \
        const u8* __restrict__ gate, const u8* __restrict__ up, i64 expert_stride, i64 row_bytes, int n_rows,   \
        int n_cols, const float* __restrict__ x, const int* __restrict__ order, const int* __restrict__ offsets, \
        const int* __restrict__ active, int k, const float* __restrict__ gate_bias,                             \
        const float* __restrict__ up_bias, int act, float limit, float alpha, float* __restrict__ y) {          \
        const MoeWeights mw{{gate, up}, {gate_bias, up_bias}, expert_stride, row_bytes, n_rows, n_cols,         \
                            act,        limit,      alpha};                                                     \
        moe_grouped<FMT, 2, const float*>(mw, x, 0, order, offsets, active, k, y);                              \
    }                                                                                                           \
    extern "C" __global__ void __launch_bounds__(32 * MOE_WARPS) moe_pair_##SUFFIX(                             \
        const u8* __restrict__ w, i64 expert_stride, i64 row_bytes, int n_rows, int n_cols,                     \
        const float* __restrict__ x, const int* __restrict__ chosen, int k, const float* __restrict__ bias,     \
        int act, float* __restrict__ y) {                                                                       \
        const MoeWeights mw{{w, w}, {bias, bias}, expert_stride, row_bytes, n_rows, n_cols, act, 0.f, 0.f};    \
        moe_per_pair<FMT, 1>(mw, x, chosen, k, y);                                                              \
    }                                                                                                           \
    extern "C" __global__ void __launch_bounds__(32 * MOE_WARPS) moe_pair_gated_##SUFFIX(                       \
        const u8* __restrict__ gate, const u8* __restrict__ up, i64 expert_stride, i64 row_bytes, int n_rows,   \
        int n_cols, const float* __restrict__ x, const int* __restrict__ chosen, int k,                         \
        const float* __restrict__ gate_bias, const float* __restrict__ up_bias, int act, float limit,           \
        float alpha, float* __restrict__ y) {                                                                   \
        const MoeWeights mw{{gate, up}, {gate_bias, up_bias}, expert_stride, row_bytes, n_rows, n_cols,         \
                            act,        limit,      alpha};                                                     \
        moe_per_pair<FMT, 2>(mw, x, chosen, k, y);                                                              \
    }                                                                                                           \
    extern "C" __global__ void __launch_bounds__(32 * MOE_MAX_K) moe_down_combine_##SUFFIX(                     \
        const u8* __restrict__ w, i64 expert_stride, i64 row_bytes, int n_rows, int n_cols,                     \
        const float* __restrict__ act, const int* __restrict__ chosen, const float* __restrict__ weights,       \
        const float* __restrict__ expert_scale, int k, const float* __restrict__ bias,                          \
        const float* __restrict__ shared, const float* __restrict__ shared_logit, i64 logit_stride,             \
        float* __restrict__ out) {                                                                              \
        const MoeWeights mw{{w, w}, {bias, bias}, expert_stride, row_bytes, n_rows, n_cols, -1, 0.f, 0.f};     \
        moe_down_combine<FMT>(mw, act, chosen, weights, expert_scale, k, shared, shared_logit, logit_stride, out); \
    }

// One level more, so that PADDOCK_FORMAT is expanded (to q4_k, ...) before `##` pastes it into the name.
#define MOE_GROUPED_FORMAT(SUFFIX, FMT) MOE_GROUPED_KERNEL(SUFFIX, FMT)

#if defined(PADDOCK_ALL_VARIANTS)
PADDOCK_FORMATS(MOE_GROUPED_KERNEL)
#else
MOE_GROUPED_FORMAT(PADDOCK_FORMAT, PADDOCK_FORMAT_STRUCT)
#endif

// -- the grouped products over int16 x --------------------------------------------------------------------------
//
// moe_xq quantizes the inputs once (x's token rows before gate/up, the activations' pair rows before down); then
// moe_grouped_int_<fmt> / moe_grouped_gated_int_<fmt> run moe_grouped's rows, lanes and pairs with the int16-x
// unit. The formats with integer codes only (quant.cuh's codes() and icoef(): the block formats, not F16/BF16/F32);
// kernels/moe.py launches them for those, and the others' builds of these kernels are empty.

// rows x n_cols floats -> codes [rows, n_cols] and ds [rows, n_cols / 16] (xq_group per 16 columns): a thread a group.
extern "C" __global__ void moe_xq(const float* __restrict__ x, int n_rows, int n_cols, u16* __restrict__ codes,
                                  float2* __restrict__ ds) {
    after_previous_grid();
    const i64 grp = (i64)blockIdx.x * blockDim.x + threadIdx.x;  // rows are whole groups: the groups run on
    if (grp >= (i64)n_rows * (n_cols >> 4)) return;
    const float4* p = reinterpret_cast<const float4*>(x + 16 * grp);
    float4 v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = __ldg(p + i);
    uint4 c[2];
    ds[grp] = xq_group(v, c);
    uint4* out = reinterpret_cast<uint4*>(codes + 16 * grp);
    out[0] = c[0];
    out[1] = c[1];
}

// Whether a format has integer codes (codes() and icoef()).
template <class F>
struct moe_int_codes {
    template <class G>
    static constexpr bool test(decltype(&G::codes)) {
        return true;
    }
    template <class G>
    static constexpr bool test(...) {
        return false;
    }
    static constexpr bool value = test<F>(nullptr);
};

// moe_grouped over int16 x, for a format with integer codes (nothing for the others; a template, so that their
// discarded branch is never instantiated).
template <class Fmt, int G>
__device__ __forceinline__ void moe_grouped_int(const MoeWeights& mw, MoeXq x, int x_per_pair,
                                                const int* __restrict__ order, const int* __restrict__ offsets,
                                                const int* __restrict__ active, int k, float* __restrict__ y) {
    if constexpr (moe_int_codes<Fmt>::value)
        moe_grouped<Fmt, G, MoeXq>(mw, x, x_per_pair, order, offsets, active, k, y);
}

#define MOE_INT_KERNEL(SUFFIX, FMT)                                                                                \
    extern "C" __global__ void __launch_bounds__(32 * MOE_WARPS) moe_grouped_int_##SUFFIX(                         \
        const u8* __restrict__ w, i64 expert_stride, i64 row_bytes, int n_rows, int n_cols,                        \
        const u16* __restrict__ codes, const float2* __restrict__ ds, int x_per_pair, const int* __restrict__ order, \
        const int* __restrict__ offsets, const int* __restrict__ active, int k, const float* __restrict__ bias,    \
        int act, float* __restrict__ y) {                                                                          \
        const MoeWeights mw{{w, w}, {bias, bias}, expert_stride, row_bytes, n_rows, n_cols, act, 0.f, 0.f};       \
        moe_grouped_int<FMT, 1>(mw, MoeXq{codes, ds}, x_per_pair, order, offsets, active, k, y);               \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(32 * MOE_WARPS) moe_grouped_gated_int_##SUFFIX(                   \
        const u8* __restrict__ gate, const u8* __restrict__ up, i64 expert_stride, i64 row_bytes, int n_rows,      \
        int n_cols, const u16* __restrict__ codes, const float2* __restrict__ ds, const int* __restrict__ order,   \
        const int* __restrict__ offsets, const int* __restrict__ active, int k,                                    \
        const float* __restrict__ gate_bias, const float* __restrict__ up_bias, int act, float limit, float alpha, \
        float* __restrict__ y) {                                                                                   \
        const MoeWeights mw{{gate, up}, {gate_bias, up_bias}, expert_stride, row_bytes, n_rows, n_cols,            \
                            act,        limit,      alpha};                                                        \
        moe_grouped_int<FMT, 2>(mw, MoeXq{codes, ds}, 0, order, offsets, active, k, y);                        \
    }

#define MOE_INT_FORMAT(SUFFIX, FMT) MOE_INT_KERNEL(SUFFIX, FMT)

#if defined(PADDOCK_ALL_VARIANTS)
PADDOCK_FORMATS(MOE_INT_KERNEL)
#else
MOE_INT_FORMAT(PADDOCK_FORMAT, PADDOCK_FORMAT_STRUCT)
#endif

// act(gate) * up per element (moe_act's kinds), for gate and up products run apart (formats that differ).
extern "C" __global__ void moe_gated(const float* __restrict__ gate, const float* __restrict__ up, i64 n, int kind,
                                     float limit, float alpha, float* __restrict__ out) {
    after_previous_grid();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = moe_act(kind, kind == 2 ? 0.f : gate[i], up[i], limit, alpha);
}

// out[t, c] = sum over t's k pairs, in expert-id order, of weights[t, j] * h[where[t k + j], c], each weight
// times its expert's factor first where expert_scale is given (Gemma 4: as moe/ops.py scales the routed
// weights). Thread j < k places slot j by its rank among the token's experts (ids are distinct: a token picks
// an expert once); then four columns a thread (n_cols % 4 == 0), the pairs' rows read as float4.
extern "C" __global__ void moe_combine(const float* __restrict__ h, const int* __restrict__ chosen,
                                       const float* __restrict__ weights, const float* __restrict__ expert_scale,
                                       const int* __restrict__ where, int k, int n_cols, float* __restrict__ out) {
    __shared__ const float4* rows[MOE_MAX_K];
    __shared__ float scale[MOE_MAX_K];
    after_previous_grid();
    const int t = blockIdx.x;
    if ((int)threadIdx.x < k) {
        const i64 q = (i64)t * k + threadIdx.x;
        const int rank = moe_rank(chosen + (i64)t * k, k, threadIdx.x);
        rows[rank] = reinterpret_cast<const float4*>(h + (i64)where[q] * n_cols);
        scale[rank] = moe_pair_weight(weights, expert_scale, chosen, q);
    }
    __syncthreads();
    for (int c = threadIdx.x; c < n_cols / 4; c += blockDim.x) {
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int j = 0; j < k; ++j) {
            const float4 v = rows[j][c];
            const float w = scale[j];
            acc = make_float4(acc.x + v.x * w, acc.y + v.y * w, acc.z + v.z * w, acc.w + v.w * w);
        }
        reinterpret_cast<float4*>(out + (i64)t * n_cols)[c] = acc;
    }
}
