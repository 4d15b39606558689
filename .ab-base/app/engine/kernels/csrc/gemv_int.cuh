// Single-token GEMV with x as 16-bit integers: the bodies of gemv_int.cu.
//
// Why: with float32 x, every 16 bytes of 4-bit weights cost a lane 128 bytes of x from L1
// plus a float conversion and an FMA per weight; the H200 profile showed the issue slots and
// L1 saturated while HBM ran at 31-37% (docs/tuning-log.md). Here each block
// first quantizes x into shared memory: per 16 columns, int16 codes q = rint(x * 32767 /
// max|x|) with their scale d = max|x| / 32767 and the exact float sum of the 16 values. A
// weight run of 16 integer codes then costs eight dp2a (two int16 x int8 products each)
// against the x codes, and sum_run(w * x) = a * d * sum(code * q) + b * sum_run(x) with the
// format's (a, b) from icoef(). The weights are exact; x carries a rounding error of at
// most d / 2 = max|x| / 65534 per value, finer than float16's. int8 x (llama.cpp's q8_1,
// four products per dp4a) was tried first and rejected: emulated on the embedded Gemma 3
// 270M it changed the greedy text of 4 of 9 reference prompts.
//
// Work split: each warp owns R rows and walks all their 32-weight units (lane l takes units
// l, l + 32, ...), so partial sums meet with warp shuffles only; blocks loop over row
// groups, so the one quantization of x per block is shared by many rows.
//
// Shared-memory layout: a unit's x codes are four 16-byte chunks (two per run), and chunk e of
// the unit in slot s sits at chunk index e * units + s; the unit's two (d, sum) pairs at
// s and units + s. Lanes take neighbouring slots, so each 16-byte load of a warp covers
// consecutive addresses: no bank conflicts. (Laid out by column, the units a warp reads sit
// 64-512 bytes apart and most lanes hit the same banks: Nsight Compute showed the shared
// memory pipe 85% busy and half the stalls waiting on it.) The slot of unit u is
// (u % U) * (units / U) + u / U. The layout depends on the format's column map, i.e. on RUN1
// (16: the 32-weight formats, 32: Q4_K/Q5_K, 64: Q6_K); weights with different maps that
// share x (q/k/v of a Q4_K_M file) get one copy each.
//
// Fused RMSNorm: with a norm weight (XqNorm.w), x is first folded into the residual stream and
// normalized, x' = (x + res) * rstd * w, as add_rms_norm would write it; every block computes
// rstd itself (it reads all of x anyway) and block 0 writes x + res as the new residual. That
// saves the norm's own launch before q/k/v and gate/up (~3 us each in a decode graph).
#pragma once
#include "block_sum.cuh"
#include "gemv.cuh"

// The optional add + RMSNorm in front of the product (above); w == nullptr: none.
struct XqNorm {
    const float* res;  // added to x first; nullptr: nothing to add (the first layer)
    const float* w;    // the norm's weight
    float* new_res;    // x + res, written by block 0
    float eps;
};

// rstd of x + res over n_cols, and block 0's copy of x + res into new_res. One block_sum per kernel.
__device__ __forceinline__ float xq_norm_rstd(const float* __restrict__ x, int n_cols, const XqNorm& nrm) {
    __shared__ float scratch[32];
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const float4* r4 = reinterpret_cast<const float4*>(nrm.res);
    float ss = 0.f;
#pragma unroll 8  // the loads of every step in flight together: each step would be another L2 round trip
    for (int i = threadIdx.x; i < n_cols / 4; i += blockDim.x) {
        float4 v = __ldg(x4 + i);
        if (nrm.res != nullptr) {
            const float4 r = __ldg(r4 + i);
            v = make_float4(r.x + v.x, r.y + v.y, r.z + v.z, r.w + v.w);
        }
        if (blockIdx.x == 0) reinterpret_cast<float4*>(nrm.new_res)[i] = v;
        ss = sum_squares(v, ss);
    }
    return 1.f / sqrtf(block_sum(ss, scratch) / (float)n_cols + nrm.eps);
}

#define XQ_GROUP 16
#ifndef XQ_PRELOAD
#define XQ_PRELOAD 1  // xq_preload: each warp's first weights loaded before the kernel's wait
#endif

#define XQ_LEVELS 32767.f
#ifndef XQ_QB
#define XQ_QB 1  // 16-column groups of x a thread loads at once in xq_quantize (gemv_int.py picks it)
#endif

// Bytes of dynamic shared memory per layout for n_cols columns: the codes, then (d, sum) per run.
__host__ __device__ constexpr int xq_shared_bytes(int n_cols) { return 2 * n_cols + (n_cols / XQ_GROUP) * 8; }

// rint(lo) and rint(hi) as the low and high int16 of a word, for |v| < 2^22. Adding 1.5 * 2^23 leaves
// rint(v) (ties to even, as __float2int_rn) in the low mantissa bits: a full-rate FADD where the
// conversion is a quarter-rate instruction, and a block converts all of x (4096-12288 values) per
// GEMV. __fadd_rn keeps the add out of an FMA with the product before it (the code is rint of the
// float product, as before).
__device__ __forceinline__ u32 xq_pair(float lo, float hi) {
    constexpr float MAGIC = 12582912.f;
    return __byte_perm(__float_as_uint(__fadd_rn(lo, MAGIC)), __float_as_uint(__fadd_rn(hi, MAGIC)), 0x5410);
}

// One 16-column group v of x as 16 int16 codes (c[0]: values 0-7, c[1]: 8-15), code = rint(v * 32767 / max|v|),
// and its (d, sum): d = max|v| / 32767 and the exact float sum of the 16 values.
__device__ __forceinline__ float2 xq_group(const float4 (&v)[4], uint4 (&c)[2]) {
    float amax = 0.f, sum = 0.f;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const float4 e = v[k];
        amax = fmaxf(amax, fmaxf(fmaxf(fabsf(e.x), fabsf(e.y)), fmaxf(fabsf(e.z), fabsf(e.w))));
        sum += (e.x + e.y) + (e.z + e.w);
    }
    const float inv = amax > 0.f ? XQ_LEVELS / amax : 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float4 a = v[2 * h], d = v[2 * h + 1];
        c[h] = make_uint4(xq_pair(a.x * inv, a.y * inv), xq_pair(a.z * inv, a.w * inv), xq_pair(d.x * inv, d.y * inv),
                          xq_pair(d.z * inv, d.w * inv));
    }
    return make_float2(amax / XQ_LEVELS, sum);
}

// Which copy of x a format reads: weights whose column maps differ need their own.
template <class Fmt>
__device__ __forceinline__ constexpr int xq_layout() {
    return Fmt::RUN1 == 16 ? 0 : Fmt::RUN1 == 32 ? 1 : 2;
}

// The unit and run that hold x's 16-column group `grp` in layout LAYOUT (xq_layout): Fmt::x_base
// inverted. 32-weight formats: unit u takes groups 2u and 2u + 1. In a 256-column block, unit s of
// Q4_K/Q5_K takes local groups (s >> 1) * 4 + (s & 1) + 2 run, of Q6_K (s >> 2) * 8 + (s & 3) + 4 run.
template <int LAYOUT>
__device__ __forceinline__ void xq_group_place(int grp, int& u, int& run) {
    const int g = grp & 15, block_units = (grp >> 4) * 8;
    if constexpr (LAYOUT == 0) {
        u = grp >> 1;
        run = grp & 1;
    } else if constexpr (LAYOUT == 1) {
        u = block_units + ((g >> 2) << 1) + (g & 1);
        run = (g >> 1) & 1;
    } else {
        u = block_units + ((g >> 3) << 2) + (g & 3);
        run = (g >> 2) & 1;
    }
}

// Group grp's 16 codes (lo: values 0-7, hi: 8-15) and (d, sum) into their place in a layout at smem.
template <int LAYOUT, int U>
__device__ __forceinline__ void xq_store_group(u8* smem, int n_cols, int grp, uint4 lo, uint4 hi, float2 ds) {
    const int units = n_cols >> 5;
    int u, run;
    xq_group_place<LAYOUT>(grp, u, run);
    const int slot = (u % U) * (units / U) + u / U;
    uint4* chunks = reinterpret_cast<uint4*>(smem);
    chunks[2 * run * units + slot] = lo;
    chunks[(2 * run + 1) * units + slot] = hi;
    reinterpret_cast<float2*>(smem + 2 * n_cols)[run * units + slot] = ds;
}

// x (n_cols floats; normalized first when nrm.w is set, with rstd from xq_norm_rstd) in layout L0 at s0
// and, where a weight needs another (L1 / L2 >= 0), in L1 at s1 and L2 at s2. One thread per 16-column
// group, QB groups per thread loaded before any is quantized (one round trip to x for up to QB *
// blockDim.x groups), each quantized once and stored in every layout. No barrier: the caller syncs.
template <int U, int QB, int L0, int L1 = -1, int L2 = -1>
__device__ __forceinline__ void xq_quantize(const float* __restrict__ x, int n_cols, const XqNorm& nrm, float rstd,
                                            u8* s0, u8* s1 = nullptr, u8* s2 = nullptr) {
    const int groups = n_cols >> 4;
    for (int base = threadIdx.x; base < groups; base += QB * blockDim.x) {
        float4 v[QB][4];
#pragma unroll
        for (int b = 0; b < QB; ++b) {
            const int c0 = (base + b * blockDim.x) * 16;
            if (c0 >= n_cols) break;
            const float4* p = reinterpret_cast<const float4*>(x + c0);
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                v[b][k] = __ldg(p + k);
                if (nrm.w != nullptr) {
                    if (nrm.res != nullptr) {
                        const float4 r = __ldg(reinterpret_cast<const float4*>(nrm.res + c0) + k);
                        v[b][k] = make_float4(r.x + v[b][k].x, r.y + v[b][k].y, r.z + v[b][k].z, r.w + v[b][k].w);
                    }
                    v[b][k] = norm_scale(v[b][k], rstd, __ldg(reinterpret_cast<const float4*>(nrm.w + c0) + k));
                }
            }
        }
#pragma unroll
        for (int b = 0; b < QB; ++b) {
            const int grp = base + b * blockDim.x;
            if (grp >= groups) break;
            uint4 c[2];
            const float2 ds = xq_group(v[b], c);
            xq_store_group<L0, U>(s0, n_cols, grp, c[0], c[1], ds);
            if constexpr (L1 >= 0) xq_store_group<L1, U>(s1, n_cols, grp, c[0], c[1], ds);
            if constexpr (L2 >= 0) xq_store_group<L2, U>(s2, n_cols, grp, c[0], c[1], ds);
        }
    }
}

// Sum over a run of codes (word k: codes 4k..4k+3) times x codes (words 2k, 2k+1 of lo:hi).
template <class Fmt>
__device__ __forceinline__ void xq_dot_runs(const Fmt& f, uint4 alo, uint4 ahi, uint4 clo, uint4 chi, int& i0,
                                            int& i1) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        u32 c0, c1;
        f.codes(k, c0, c1);
        const uint4 a = k < 2 ? alo : ahi, c = k < 2 ? clo : chi;
        i0 = __dp2a_lo((int)((k & 1) ? a.z : a.x), (int)c0, i0);
        i0 = __dp2a_hi((int)((k & 1) ? a.w : a.y), (int)c0, i0);
        i1 = __dp2a_lo((int)((k & 1) ? c.z : c.x), (int)c1, i1);
        i1 = __dp2a_hi((int)((k & 1) ? c.w : c.y), (int)c1, i1);
    }
}

// The weights of pass u0 (units u0 .. u0 + U - 1 of each row) into f.
template <class Fmt, int R, int U>
__device__ __forceinline__ void xq_load_pass(Fmt (&f)[U][R], const u8* const (&rows)[R], int u0) {
#pragma unroll
    for (int i = 0; i < U; ++i)
#pragma unroll
        for (int r = 0; r < R; ++r) f[i][r].load(rows[r], u0 + i);
}

// This lane's share of acc[r] = sum_c W[rows[r], c] * x[c], x from xq_quantize in Fmt's layout at smem. A lane takes
// U consecutive units per step (units U*lane.., then 32*U further on): with U = 2 a k-quant
// lane reads 32 contiguous quant bytes, and the two units' shared block header is loaded and
// decoded once (the compiler merges the identical loads and scale decoding). units % U == 0.
// preloaded: f already holds this lane's first pass (xq_preload, before the kernel's wait).
// (Loading the next pass while multiplying this one, with a second Fmt array, was tried: the
// registers it took cut the blocks per multiprocessor and the 8B step got slower.)
template <class Fmt, int R, int U>
__device__ __forceinline__ void xq_accumulate(const u8* const (&rows)[R], int n_cols, const u8* smem, float (&acc)[R],
                                              Fmt (&f)[U][R], bool preloaded) {
    const int lane = threadIdx.x & 31, units = n_cols >> 5, per = units / U;
    const uint4* chunks = reinterpret_cast<const uint4*>(smem);
    const float2* xs = reinterpret_cast<const float2*>(smem + 2 * n_cols);
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.f;
    for (int u0 = lane * U; u0 < units; u0 += 32 * U) {
        if (!preloaded || u0 != lane * U) xq_load_pass<Fmt, R, U>(f, rows, u0);
#pragma unroll
        for (int i = 0; i < U; ++i) {
            const int slot = i * per + u0 / U;
            const uint4 alo = chunks[slot], ahi = chunks[units + slot];
            const uint4 clo = chunks[2 * units + slot], chi = chunks[3 * units + slot];
            const float2 ga = xs[slot], gc = xs[units + slot];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                int i0 = 0, i1 = 0;
                xq_dot_runs(f[i][r], alo, ahi, clo, chi, i0, i1);
                float a0, b0, a1, b1;
                f[i][r].icoef(a0, b0, a1, b1);
                acc[r] += fmaf(a0 * ga.x, (float)i0, b0 * ga.y) + fmaf(a1 * gc.x, (float)i1, b1 * gc.y);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = warp_sum(acc[r]);
}

// Row pointers of row group g of one weight; rows past n_rows re-read the last row.
template <int R>
__device__ __forceinline__ void xq_group_rows(const u8* w, i64 row_bytes, int n_rows, int g, const u8* (&rows)[R]) {
#pragma unroll
    for (int r = 0; r < R; ++r) rows[r] = w + (i64)min(g * R + r, n_rows - 1) * row_bytes;
}

// Before the kernel's wait (PDL, common.cuh): this lane's first pass of row group g's weights into
// registers, so the first HBM round trip overlaps the kernel before and this kernel's own
// quantization of x instead of following them. Weights are never written by a kernel, so reading
// them early is allowed. Returns whether f was filled (xq_accumulate's `preloaded`).
template <class Fmt, int R, int U>
__device__ __forceinline__ bool xq_preload(Fmt (&f)[U][R], const u8* w, i64 row_bytes, int n_rows, int n_cols, int g) {
#if XQ_PRELOAD
    if (g * R >= n_rows || (threadIdx.x & 31) * U >= (n_cols >> 5)) return false;
    const u8* rows[R];
    xq_group_rows<R>(w, row_bytes, n_rows, g, rows);
    xq_load_pass<Fmt, R, U>(f, rows, (threadIdx.x & 31) * U);
    return true;
#else
    return false;
#endif
}

// Row group g (rows g*R .. g*R+R-1) of one weight, by one warp: y[row] = sum (+ bias[row]).
template <class Fmt, int R, int U>
__device__ __forceinline__ void xq_rows(const u8* __restrict__ w, i64 row_bytes, int n_rows, int n_cols,
                                        const u8* smem, float* __restrict__ y,
                                        const float* __restrict__ bias, int g, Fmt (&f)[U][R], bool preloaded) {
    const int row0 = g * R, lane = threadIdx.x & 31;
    const u8* rows[R];
    xq_group_rows<R>(w, row_bytes, n_rows, g, rows);
    float acc[R];
    xq_accumulate<Fmt, R, U>(rows, n_cols, smem, acc, f, preloaded);
#pragma unroll
    for (int r = 0; r < R; ++r)
        if (lane == r && row0 + r < n_rows) y[row0 + r] = acc[r] + (bias != nullptr ? bias[row0 + r] : 0.f);
}

// Row group g of gate (A) and up (B): y[row] = act(gate . x) * (up . x). One format for both: fa
// holds all 2 * RH rows (fb unused); two formats: fa the gate's rows, fb the up's.
template <class FA, class FB, int RH, int U>
struct XqGatedPass {
    static constexpr bool same = same_type<FA, FB>::value;
    FA fa[U][same ? 2 * RH : RH];
    FB fb[U][RH];
};

// The gate rows (first RH) and up rows (last RH) of gated_row_pointers, apart.
template <int RH>
__device__ __forceinline__ void xq_halves(const u8* const (&rows)[2 * RH], const u8* (&rows_a)[RH],
                                          const u8* (&rows_b)[RH]) {
#pragma unroll
    for (int r = 0; r < RH; ++r) {
        rows_a[r] = rows[r];
        rows_b[r] = rows[RH + r];
    }
}

template <class FA, class FB, int RH, int U, int ACT>
__device__ __forceinline__ void xq_gated_rows(const u8* __restrict__ wa, const u8* __restrict__ wb, i64 row_bytes_a,
                                              i64 row_bytes_b, int n_rows, int n_cols, const u8* smem_a,
                                              const u8* smem_b, float* __restrict__ y, int g,
                                              XqGatedPass<FA, FB, RH, U>& pass, bool preloaded) {
    const int row0 = g * RH, lane = threadIdx.x & 31;
    float acc[2 * RH];
    const u8* rows[2 * RH];
    gated_row_pointers<RH>(wa, wb, row_bytes_a, row_bytes_b, row0, n_rows, rows);
    if constexpr (XqGatedPass<FA, FB, RH, U>::same) {
        xq_accumulate<FA, 2 * RH, U>(rows, n_cols, smem_a, acc, pass.fa, preloaded);
    } else {
        const u8* rows_a[RH];
        const u8* rows_b[RH];
        xq_halves<RH>(rows, rows_a, rows_b);
        float acc_a[RH], acc_b[RH];
        xq_accumulate<FA, RH, U>(rows_a, n_cols, smem_a, acc_a, pass.fa, preloaded);
        xq_accumulate<FB, RH, U>(rows_b, n_cols, smem_b, acc_b, pass.fb, preloaded);
#pragma unroll
        for (int r = 0; r < RH; ++r) {
            acc[r] = acc_a[r];
            acc[RH + r] = acc_b[r];
        }
    }
#pragma unroll
    for (int r = 0; r < RH; ++r)
        if (lane == r && row0 + r < n_rows) y[row0 + r] = gated_act<ACT>(acc[r], acc[RH + r]);
}

// xq_preload for gate/up: the first pass of row group g of both weights.
template <class FA, class FB, int RH, int U>
__device__ __forceinline__ bool xq_gated_preload(XqGatedPass<FA, FB, RH, U>& pass, const u8* wa, const u8* wb,
                                                 i64 row_bytes_a, i64 row_bytes_b, int n_rows, int n_cols, int g) {
#if XQ_PRELOAD
    if (g * RH >= n_rows || (threadIdx.x & 31) * U >= (n_cols >> 5)) return false;
    const u8* rows[2 * RH];
    gated_row_pointers<RH>(wa, wb, row_bytes_a, row_bytes_b, g * RH, n_rows, rows);
    const int u0 = (threadIdx.x & 31) * U;
    if constexpr (XqGatedPass<FA, FB, RH, U>::same) {
        xq_load_pass<FA, 2 * RH, U>(pass.fa, rows, u0);
    } else {
        const u8* rows_a[RH];
        const u8* rows_b[RH];
        xq_halves<RH>(rows, rows_a, rows_b);
        xq_load_pass<FA, RH, U>(pass.fa, rows_a, u0);
        xq_load_pass<FB, RH, U>(pass.fb, rows_b, u0);
    }
    return true;
#else
    return false;
#endif
}

// The row groups of this block's warps: g = blockIdx.x * warps + warp, then a grid's worth on.
#define XQ_FOR_EACH_GROUP(g, n_groups)                                                               \
    for (int g = (int)blockIdx.x * (int)(blockDim.x >> 5) + (int)(threadIdx.x >> 5); g < (n_groups); \
         g += (int)gridDim.x * (int)(blockDim.x >> 5))

// Before the wait for the previous kernel (common.cuh): the start of each row of this warp's first
// row group into L2, the bytes its first passes read (lane l reads units l, l + 32, ...).
__device__ __forceinline__ int xq_first_group() {
    return (int)blockIdx.x * (int)(blockDim.x >> 5) + (int)(threadIdx.x >> 5);
}

template <int R>
__device__ __forceinline__ void xq_prefetch_group(const u8* w, i64 row_bytes, int n_rows, int g, int share = 1) {
    const i64 head = min(row_bytes, (i64)(PDL_PREFETCH_WARP_BYTES / (R * share)));
#pragma unroll
    for (int r = 0; r < R; ++r)
        if (g * R + r < n_rows) prefetch_l2_warp(w + (i64)(g * R + r) * row_bytes, head);
}

// One weight: y[row] = W[row] . x (+ bias[row]). smem: xq_shared_bytes(n_cols) bytes.
template <class Fmt, int R, int U>
__device__ __forceinline__ void xq_gemv_body(const u8* __restrict__ w, i64 row_bytes, int n_rows, int n_cols,
                                             const float* __restrict__ x, float* __restrict__ y,
                                             const float* __restrict__ bias, const XqNorm& nrm, u8* smem) {
    const int first = xq_first_group();
    if ((i64)n_rows * row_bytes <= PDL_PREFETCH_MAX_WEIGHT) xq_prefetch_group<R>(w, row_bytes, n_rows, first);
    Fmt f[U][R];
    const bool preloaded = xq_preload<Fmt, R, U>(f, w, row_bytes, n_rows, n_cols, first);
    after_previous_grid();
    const float rstd = nrm.w != nullptr ? xq_norm_rstd(x, n_cols, nrm) : 1.f;
    xq_quantize<U, XQ_QB, xq_layout<Fmt>()>(x, n_cols, nrm, rstd, smem);
    __syncthreads();
    XQ_FOR_EACH_GROUP(g, (n_rows + R - 1) / R)
    xq_rows<Fmt, R, U>(w, row_bytes, n_rows, n_cols, smem, y, bias, g, f, preloaded && g == first);
}

// Up to three weights stacked along the output (q, k, v): y = [W0 x; W1 x; W2 x] (+ bias).
// A warp's row group belongs to one weight, so the branch is uniform over the warp. smem:
// one xq_shared_bytes(n_cols) copy per distinct layout, in order of first use. A warp's first
// group is preloaded when it lies in W0, or in W1 of W0's format (q and k of a Q4_K_M file).
template <class F0, class F1, class F2, int R, int U>
__device__ __forceinline__ void xq_multi_body(const u8* __restrict__ w0, const u8* __restrict__ w1,
                                              const u8* __restrict__ w2, i64 row_bytes0, i64 row_bytes1,
                                              i64 row_bytes2, int rows0, int rows1, int rows2, int n_cols,
                                              const float* __restrict__ x, float* __restrict__ y,
                                              const float* __restrict__ bias, const XqNorm& nrm, u8* smem) {
    constexpr int l0 = xq_layout<F0>(), l1 = xq_layout<F1>(), l2 = xq_layout<F2>();
    constexpr int c1 = l1 == l0 ? 0 : 1, c2 = l2 == l0 ? 0 : l2 == l1 ? c1 : c1 + 1;  // copy of each weight
    constexpr bool same01 = same_type<F0, F1>::value;
    const int bytes = xq_shared_bytes(n_cols);
    u8 *x0 = smem, *x1 = smem + c1 * bytes, *x2 = smem + c2 * bytes;
    const int groups0 = (rows0 + R - 1) / R, groups1 = (rows1 + R - 1) / R, groups2 = (rows2 + R - 1) / R;
    const int first = xq_first_group();
    if ((i64)rows0 * row_bytes0 + (i64)rows1 * row_bytes1 + (i64)rows2 * row_bytes2 <= PDL_PREFETCH_MAX_WEIGHT) {
        if (first < groups0)
            xq_prefetch_group<R>(w0, row_bytes0, rows0, first);
        else if (first < groups0 + groups1)
            xq_prefetch_group<R>(w1, row_bytes1, rows1, first - groups0);
        else
            xq_prefetch_group<R>(w2, row_bytes2, rows2, first - groups0 - groups1);
    }
    F0 f[U][R];
    bool preloaded = false;
    if (first < groups0)
        preloaded = xq_preload<F0, R, U>(f, w0, row_bytes0, rows0, n_cols, first);
    else if (same01 && first < groups0 + groups1)
        preloaded = xq_preload<F0, R, U>(f, w1, row_bytes1, rows1, n_cols, first - groups0);
    after_previous_grid();
    const float rstd = nrm.w != nullptr ? xq_norm_rstd(x, n_cols, nrm) : 1.f;
    xq_quantize<U, XQ_QB, l0, (c1 == 1 ? l1 : -1), (c2 > c1 ? l2 : -1)>(x, n_cols, nrm, rstd, x0, x1, x2);
    __syncthreads();
    XQ_FOR_EACH_GROUP(g, groups0 + groups1 + groups2) {
        const bool pre = preloaded && g == first;
        if (g < groups0) {
            xq_rows<F0, R, U>(w0, row_bytes0, rows0, n_cols, x0, y, bias, g, f, pre);
        } else if (g < groups0 + groups1) {
            float* y1 = y + rows0;
            const float* b1 = bias == nullptr ? nullptr : bias + rows0;
            if constexpr (same01) {
                xq_rows<F0, R, U>(w1, row_bytes1, rows1, n_cols, x1, y1, b1, g - groups0, f, pre);
            } else {
                F1 f1[U][R];
                xq_rows<F1, R, U>(w1, row_bytes1, rows1, n_cols, x1, y1, b1, g - groups0, f1, false);
            }
        } else {
            F2 f2[U][R];
            xq_rows<F2, R, U>(w2, row_bytes2, rows2, n_cols, x2, y + rows0 + rows1,
                              bias == nullptr ? nullptr : bias + rows0 + rows1, g - groups0 - groups1, f2, false);
        }
    }
}

// Gate and up: y[row] = act(gate[row] . x) * (up[row] . x). smem: one or two layouts.
template <class FA, class FB, int RH, int U, int ACT>
__device__ __forceinline__ void xq_gated_body(const u8* __restrict__ wa, const u8* __restrict__ wb, i64 row_bytes_a,
                                              i64 row_bytes_b, int n_rows, int n_cols, const float* __restrict__ x,
                                              float* __restrict__ y, const XqNorm& nrm, u8* smem) {
    constexpr bool two = xq_layout<FA>() != xq_layout<FB>();
    u8* xb = two ? smem + xq_shared_bytes(n_cols) : smem;
    const int first = xq_first_group();
    if ((i64)n_rows * (row_bytes_a + row_bytes_b) <= PDL_PREFETCH_MAX_WEIGHT) {
        xq_prefetch_group<RH>(wa, row_bytes_a, n_rows, first, 2);
        xq_prefetch_group<RH>(wb, row_bytes_b, n_rows, first, 2);
    }
    XqGatedPass<FA, FB, RH, U> pass;
    const bool preloaded = xq_gated_preload<FA, FB, RH, U>(pass, wa, wb, row_bytes_a, row_bytes_b, n_rows, n_cols, first);
    after_previous_grid();
    const float rstd = nrm.w != nullptr ? xq_norm_rstd(x, n_cols, nrm) : 1.f;
    xq_quantize<U, XQ_QB, xq_layout<FA>(), (two ? xq_layout<FB>() : -1)>(x, n_cols, nrm, rstd, smem, xb);
    __syncthreads();
    XQ_FOR_EACH_GROUP(g, (n_rows + RH - 1) / RH)
    xq_gated_rows<FA, FB, RH, U, ACT>(wa, wb, row_bytes_a, row_bytes_b, n_rows, n_cols, smem, xb, y, g, pass,
                                      preloaded && g == first);
}
