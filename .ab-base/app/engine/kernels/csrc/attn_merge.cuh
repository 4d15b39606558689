// Pieces shared by attention.cu and attention_decode.cu: the online-softmax step, and the end of
// split-K attention: the blocks of
// one (token, KV head) publish their partial (acc, max, sum) triples and count themselves in;
// the last one to finish merges them, so no second launch is needed (in a decode graph that
// launch cost as much as the merge itself).
#pragma once
#include "common.cuh"

// Online softmax: fold a chunk of head h's keys, whose scores' running max is now m_new and whose
// exp(score - m_new) sum to chunk_sum, into the head's (max, sum); alpha[h] is the factor that
// rescales the values accumulated so far.
__device__ __forceinline__ void softmax_fold(int h, float m_new, float chunk_sum, float* m, float* l, float* alpha) {
    const float a = m[h] == -PADDOCK_INF ? 0.f : expf(m[h] - m_new);
    alpha[h] = a;
    l[h] = l[h] * a + chunk_sum;
    m[h] = m_new;
}

// True in the last of the n blocks that count at `count` (which it resets to zero for the next
// launch). Every thread of the block calls it, after writing its partials; `flag` is a shared int.
__device__ __forceinline__ bool attn_last_to_finish(int* count, int n, int* flag) {
    __threadfence();  // publish this block's partials before counting
    __syncthreads();
    if (threadIdx.x == 0) {
        *flag = atomicAdd(count, 1) == n - 1;
        if (*flag) *count = 0;
    }
    __syncthreads();
    const bool last = *flag;
    if (last) __threadfence();
    return last;
}

// The natural log of a row's sum of exponentials from its (max, sum): what a later merge with another
// part of the row's keys weighs it by; -inf for a row that saw no key.
__device__ __forceinline__ float attn_lse(float m, float l) { return l > 0.f ? m + logf(l) : -PADDOCK_INF; }

// A row's softmax denominator from its (max m, sum l of exp(score - m)), with the head's sink logit
// (GPT-OSS: one more logit that weighs no value) where `sinks` (the group's, nullable) has one. Far
// above every score, or with no key at all, it is inf and the row's output 0: the limit, not a NaN.
__device__ __forceinline__ float attn_denominator(float m, float l, const float* sinks, int h) {
    return sinks == nullptr ? l : l + expf(sinks[h] - m);
}

// out[(row0 + h) * D + d] for the group's heads h from partials s = first .. first + n - 1 of
// rows laid out [row][stride][D] (acc) and [row][stride] (max, sum), and with `lse_out` each row's
// attn_lse there; `sinks` (nullable) the group's sink logits, from head 0 of the group. Each split's weight
// exp(m_s - max) and the common denominator are computed once per head (one warp per head,
// its lanes over the splits) into wgt[h * wgt_stride + s] and den[h]; then every output
// element is a sum over the splits whose loads are independent (unrolled, so several are in
// flight: a serial walk of L2 loads per element made the merge the longest part of a
// decode). __ldcg: the other blocks' partials come from L2, never from a stale L1 line. `out`: float32,
// or float16 (store_as: attention_decode.cu's DEC_OUT_HALF).
template <int D, typename Out>
__device__ __forceinline__ void attn_merge_splits(const float* __restrict__ part_acc, const float* __restrict__ part_m,
                                                  const float* __restrict__ part_l, i64 row0, int group, int stride,
                                                  int first, int n, float* wgt, int wgt_stride, float* den,
                                                  Out* __restrict__ out, float* __restrict__ lse_out = nullptr,
                                                  const float* __restrict__ sinks = nullptr) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    for (int h = warp; h < group; h += n_warps) {
        const float* m_p = part_m + (row0 + h) * stride + first;
        const float* l_p = part_l + (row0 + h) * stride + first;
        float mx = -PADDOCK_INF;
        for (int s = lane; s < n; s += 32) mx = fmaxf(mx, __ldcg(m_p + s));
        mx = warp_max(mx);
        float sum = 0.f;
        for (int s = lane; s < n; s += 32) {
            const float m = __ldcg(m_p + s);
            const float w = m == -PADDOCK_INF ? 0.f : expf(m - mx);  // a split with max -inf adds nothing
            wgt[h * wgt_stride + s] = w;
            sum = fmaf(w, __ldcg(l_p + s), sum);
        }
        sum = warp_sum(sum);
        if (lane == 0) {
            den[h] = attn_denominator(mx, sum, sinks, h);
            if (lse_out != nullptr) lse_out[row0 + h] = attn_lse(mx, sum);
        }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < group * D; idx += blockDim.x) {
        const int h = idx / D, d = idx % D;
        const i64 row = row0 + h;
        const float* acc_p = part_acc + (row * stride + first) * D + d;
        float num = 0.f;
#pragma unroll 8
        for (int s = 0; s < n; ++s) num = fmaf(wgt[h * wgt_stride + s], __ldcg(acc_p + (i64)s * D), num);
        store_as(out, row * D + d, den[h] > 0.f ? num / den[h] : 0.f);
    }
}
