// Products of a few tokens (2..64) on quantized weights, through the tensor cores: the second
// kernel (gemv_mma.cu is the first, kept for A/B runs; PADDOCK_GEMV_MMA_KERNEL picks one).
//
// Same fragments and numbers as gemv_mma.cu (its header explains the k-permutation: lane t of a
// quad decodes 32-weight unit 4s + t, and its k slots are that unit's weights 4k..4k+3 of each
// run). What changes is where x comes from and how much weight is in flight; gemv_mma.cu ran at
// ~0.9 TB/s on the H200 because
// - every lane read x from global memory as float32, per k-step, per n-tile, per row tile: x
//   traffic was many times the weight bytes, and every word was converted again;
// - each lane had one 128-column step of weight loads in flight, then decoded and multiplied.
// Here
// - a pre-pass (gemv_mma2_x16) rounds x to float16 once, into a copy in global memory;
// - a block's warps form a grid of RW row-warps (each owns MT m-tiles, its own rows) by KW
//   column-warps (interleaved 128-column steps, summed in shared memory at the end). For each
//   "super-step" of KW * 128 columns the block stages that float16 x once into shared memory in
//   fragment order: word [kw][k][n][t] (16 bytes) holds x of token n at the four columns of k-step
//   k of run 0 and of run 1 of unit 4 (step) + t. A lane's B fragments of a k-step are then one
//   conflict-free 16-byte shared load per n-tile, reused by its MT m-tiles, and the staged x by
//   the RW row-warps: x read from L2 per weight byte falls by 2 RW MT against gemv_mma.cu;
// - the staging is cp.async into two buffers: the next super-step's x is copied while this one
//   is multiplied (one barrier a super-step), and the next super-step's weights are loaded into
//   registers at the same time, so a lane has two steps of weight loads in flight; the first ones
//   are issued before the wait on the previous kernel (PDL: weights are no kernel's output). Those
//   loads are the format's fetch() alone: its unpack() (the scale arithmetic) runs a super-step
//   later. With load() there, ptxas put that arithmetic, and the wait for the loads, before this
//   step's HMMAs (SASS of the Q4_K build, 2026-12-07), so every warp stalled a DRAM round trip a step;
// - weights are decoded with the formats' raw()/coef() pair (one byte permute and one FMA per
//   weight, quant.cuh) instead of get()'s integer-to-float conversions (quarter-rate on sm_90),
//   which made the decode, not memory, the limit; the integer-code formats go further, in float16
//   pairs from their codes() (GM_HDEC below: the loop is still about half issue-bound at 8 tokens);
// - where rows are few (a 4096-row q or down projection has 32-64 row tiles for 132
//   multiprocessors), gridDim.y splits the columns among blocks too. On sm_90+ the splits of a row
//   tile are one thread-block cluster (GM_CL of them) that adds its blocks' sums through distributed
//   shared memory in rank order (gm2::cluster_sum_write); elsewhere the blocks add their sums into
//   `y` with atomics, on the zeros the pre-pass wrote (two at most: see gemv_mma.MAX_SPLITS).
// Up to three weights stacked along the output (q/k/v, gate/up) are one launch, as in gemv_mma.cu.
//
// Numerics: weights decoded in float32 (w = a f + b, the same value as the dequantizers up to
// float32 rounding) and rounded once to float16, x rounded to float16, float32 accumulation. The
// cluster adds its splits in rank order: the same bits every run. With atomics, two splits give the
// same bits in either order ((0 + a) + b == (0 + b) + a).
#include "gemv_mma.cuh"
#include "mma.cuh"
#include "quant.cuh"

#ifndef GM_F0
#define GM_F0 FmtQ4_K
#define GM_F1 FmtQ4_K
#define GM_F2 FmtQ6_K
#endif
#ifndef GM_MT
#define GM_MT 1  // m-tiles of 16 rows a warp
#endif
#ifndef GM_NT
#define GM_NT 1  // n-tiles of 8 tokens
#endif
#ifndef GM_RW
#define GM_RW 4  // row-warps: warps owning different rows, sharing the staged x
#endif
#ifndef GM_KW
#define GM_KW 2  // column-warps: warps splitting the columns of the same rows
#endif
#ifndef GM_HDEC
// 1: the integer-code formats (IntCodes: Q4_0..Q5_1, Q4_K..Q6_K) decode their weights in float16 pairs, w = a u + b
// with (a, b) rounded to float16, about 1.5 instructions a weight (byte permute into 1024 + u, an exact subtraction,
// one fma) against 2.5 in float32 (byte permute, fma, and half a pack); 0: float32, one rounding a weight where this
// gives up to three (a, b, the fma), all at float16's precision. The loop is about half issue-bound at 8 tokens: on the
// H100 q at 8 tokens 12.8 -> 11.4 us, gate+up 34.5 -> 29.0; the decode step at 8 sequences 4.71 -> 4.41 ms
// (bench/results/gpu-s30-2026-12-07.md).
#define GM_HDEC 1
#endif
// Column splits a thread-block cluster (sm_90+; gridDim.y == GM_CL), summed through distributed shared
// memory; 1: no cluster. Host builds and older devices add the splits with atomics instead.
#if defined(GM_CL) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GM_CLUSTER GM_CL
#else
#define GM_CLUSTER 1
#endif
static_assert(GM_CLUSTER == 1 || GM_CLUSTER == 2 || GM_CLUSTER == 4 || GM_CLUSTER == 8,
              "a cluster is 1, 2, 4 or 8 blocks (8: the portable maximum)");

namespace gm2 {
constexpr int WARPS = GM_RW * GM_KW;
constexpr int THREADS = 32 * WARPS;
constexpr int ROWS = 16 * GM_MT * GM_RW;          // rows a block
constexpr int TOK = 8 * GM_NT;                    // tokens staged (padded with zeros)
constexpr int XS_WORDS = GM_KW * 4 * TOK * 4;     // 16-byte words of x a super-step (one of two buffers)
constexpr int PART_WORDS = (GM_KW - 1) * GM_RW * GM_MT * GM_NT * 4 * 32 / 4;  // column-warps' sums
// The block's sums for its cluster, after the column-warps' (which warps (0, rw) may still be reading)
constexpr int CLUSTER_WORDS = GM_CLUSTER > 1 ? GM_RW * GM_MT * GM_NT * 4 * 32 / 4 : 0;
constexpr int SMEM_WORDS = 2 * XS_WORDS > PART_WORDS + CLUSTER_WORDS ? 2 * XS_WORDS : PART_WORDS + CLUSTER_WORDS;
static_assert(SMEM_WORDS * 16 <= 48 * 1024, "gemv_mma2: shared memory over 48 KiB (pick_shape keeps it under)");

template <class A, class B>
struct same {  // std::is_same (NVRTC has no <type_traits> here)
    static constexpr bool value = false;
};
template <class A>
struct same<A, A> {
    static constexpr bool value = true;
};

// 8 bytes global -> shared without passing through registers (cp.async.ca: the 16-byte .cg of
// mma.cuh cannot take them); `valid` false fills zeros. The emulator copies at once.
#ifndef PADDOCK_HOST_SHIM
__device__ __forceinline__ void cp_async8(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(shared_address(dst)), "l"(src),
                 "r"(valid ? 8 : 0));
}
#else
inline void cp_async8(void* dst, const void* src, bool valid) {
    if (valid) std::memcpy(dst, src, 8);
    else std::memset(dst, 0, 8);
}
#endif

// Whether F decodes in float16 pairs (GM_HDEC): the formats of unsigned integer codes below 1024 (IntCodes).
template <class F>
__device__ __forceinline__ constexpr bool int_codes(const IntCodes<F>*) {
    return true;
}
template <class F>
__device__ __forceinline__ constexpr bool int_codes(const void*) {
    return false;
}
template <class F>
__device__ __forceinline__ constexpr bool half_decode() {
    return GM_HDEC && int_codes<F>(static_cast<const F*>(nullptr));
}

// Where this thread's words of a super-step's staged x come from (stage_x): word j is word threadIdx.x + j THREADS
// of the buffer, [kw][k][n][t] (below), and holds x of token n at columns 4k..4k+3 of run 0 and of run 1 of unit
// 4 (step0 + kw) + t. Its source moves 128 columns a step in every format: x_base(u + 4 m) = x_base(u) + 128 m
// (four units are 128 columns, however a format interleaves them within its blocks), so a word's offset into xh
// and its unit at step 0 are all a super-step needs. Up to two words a thread (the <= 16-token builds) keep them in
// registers; more (the wider builds, short of registers) are worked out from scratch each super-step, as every build
// did before (GM_XSTAGE=0: the A/B of that).
#ifndef GM_XSTAGE
#define GM_XSTAGE 1
#endif
static_assert(XS_WORDS % THREADS == 0, "a thread stages the same number of words every super-step");
template <class F>
struct XSource {
    static constexpr int PER = XS_WORDS / THREADS;
    static constexpr bool KEPT = GM_XSTAGE && PER <= 2;
    static constexpr int PAST = 1 << 29;  // a padding token's unit: past any row, so its word reads as zero
    int off[KEPT ? PER : 1], unit[KEPT ? PER : 1];

    // Each kept word's offset into xh and unit at step 0 (its unit PAST for a padding token).
    __device__ __forceinline__ void init(int n_tok, int n_cols) {
        if constexpr (KEPT) {
#pragma unroll
            for (int j = 0; j < PER; ++j) {
                const int i = (int)threadIdx.x + j * THREADS;
                const int t = i & 3, n = (i >> 2) % TOK, kk = (i >> 2) / TOK, k = kk & 3, kw = kk >> 2;
                off[j] = n * n_cols + F::x_base(4 * kw + t) + 4 * k;  // 8-byte aligned: x_base, RUN1: 16 columns
                unit[j] = n < n_tok ? 4 * kw + t : PAST;
            }
        }
    }
};

// Start copying x of the KW steps from `step0` into `xs` (cp.async, one commit group), from the
// float16 copy `xh` that gemv_mma2_x16 made, in fragment order: word [kw][k][n][t] holds x of token
// n at columns 4k..4k+3 of run 0 (its first 8 bytes) and of run 1 (the last 8) of unit
// 4 (step0 + kw) + t. Tokens past n_tok and units past the row's end are zeros, so the weights they
// meet add nothing.
template <class F>
__device__ __forceinline__ void stage_x(uint4* xs, const u16* __restrict__ xh, const XSource<F>& src, int n_tok,
                                        int n_cols, int n_units, int step0) {
    if constexpr (XSource<F>::KEPT) {
#pragma unroll
        for (int j = 0; j < XSource<F>::PER; ++j) {
            const bool ok = src.unit[j] + 4 * step0 < n_units;
            const u16* p = xh + (ok ? src.off[j] + 128 * step0 : 0);  // nothing is read where !ok (zero-fill)
            u32* word = reinterpret_cast<u32*>(xs + threadIdx.x + j * THREADS);
            cp_async8(word, p, ok);
            cp_async8(word + 2, p + F::RUN1, ok);
        }
    } else {
        for (int i = threadIdx.x; i < XS_WORDS; i += THREADS) {
            const int t = i & 3, n = (i >> 2) % TOK, kk = (i >> 2) / TOK, k = kk & 3, kw = kk >> 2;
            const int u = 4 * (step0 + kw) + t;
            const bool ok = n < n_tok && u < n_units;
            const u16* p = xh + (i64)min(n, n_tok - 1) * n_cols + F::x_base(min(u, n_units - 1)) + 4 * k;
            u32* word = reinterpret_cast<u32*>(xs + i);
            cp_async8(word, p, ok);
            cp_async8(word + 2, p + F::RUN1, ok);
        }
    }
    cp_async_commit();
}

#if GM_CLUSTER > 1
// The end of every block of a cluster (the GM_CLUSTER column splits of rows [row0, row0 + ROWS), ranked
// along y): each leaves its sums in shared memory (`part`), then rank r adds the r-th share of the outputs
// over the cluster's blocks in rank order and writes them (bias added), so no zeros, atomics or run-to-run
// variation. A share is a run of (token, row) outputs, rows fastest: coalesced stores, and padded tokens
// cost nothing. `keeps`: the warp holds sums (the column-warps' sums went to their warp 0).
template <int MT, int NT>
__device__ __forceinline__ void cluster_sum_write(const float (&c)[MT][NT][4], bool keeps, float* part, int rw,
                                                  int row0, int n_rows, int n_tok, float* __restrict__ y, int ld_y,
                                                  int col0, const float* __restrict__ bias, int lane) {
    constexpr int PER_WARP = MT * NT * 4 * 32;
    constexpr int SHARE = TOK * ROWS / GM_CLUSTER;
    static_assert(TOK * ROWS % GM_CLUSTER == 0, "outputs split evenly over the cluster");
    __syncthreads();  // with one column-warp `part` overlaps the x buffers: every warp is done with them
    if (keeps) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) part[rw * PER_WARP + ((mt * NT + nt) * 4 + e) * 32 + lane] = c[mt][nt][e];
    }
    cluster_sync();  // every block's sums are in place
    const int rank = blockIdx.y;  // gridDim.y == GM_CLUSTER: one cluster spans the splits
    for (int o = rank * SHARE + threadIdx.x; o < (rank + 1) * SHARE; o += THREADS) {
        const int n = o / ROWS, r = o % ROWS, row = row0 + r;
        if (n >= n_tok || row >= n_rows) continue;
        // Row r is row g (+8 for the fragment's second half) of m-tile (r / 16) % MT of row-warp r / (16 MT); token
        // n is 2t (+1) of n-tile n / 8: c[mt][nt][2 half + (n & 1)] of lane 4g + t.
        const int w = r / (16 * MT), mt = (r >> 4) % MT, half = (r >> 3) & 1, g = r & 7, nt = n >> 3, t = (n & 7) >> 1;
        const int i = w * PER_WARP + ((mt * NT + nt) * 4 + 2 * half + (n & 1)) * 32 + 4 * g + t;
        float v[GM_CLUSTER];
#pragma unroll
        for (int q = 0; q < GM_CLUSTER; ++q) v[q] = cluster_map_shared(part, q)[i];  // every load before the sum
        float sum = v[0];
#pragma unroll
        for (int q = 1; q < GM_CLUSTER; ++q) sum += v[q];
        y[(i64)n * ld_y + col0 + row] = sum + (bias != nullptr ? bias[col0 + row] : 0.f);
    }
    cluster_sync();  // no block leaves while another may still read its shared memory
}
#endif

// One block's rows [row0, row0 + ROWS) of weight `w` times every token of x, over the
// super-steps of split blockIdx.y, into y's columns col0 + row (bias, when given, indexed the same
// way and added by split 0).
template <class F>
__device__ __forceinline__ void tile(const u8* __restrict__ w, i64 row_bytes, int n_rows, int row0, int n_cols,
                                     const u16* __restrict__ x, int n_tok, float* __restrict__ y, int ld_y,
                                     int col0, const float* __restrict__ bias, uint4* smem) {
    constexpr int MT = GM_MT, NT = GM_NT;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int rw = warp % GM_RW, kw = warp / GM_RW;
    const int n_units = n_cols >> 5, n_steps = (n_units + 3) >> 2, n_super = (n_steps + GM_KW - 1) / GM_KW;
    const int s_begin = (int)((i64)n_super * blockIdx.y / gridDim.y);
    const int s_end = (int)((i64)n_super * (blockIdx.y + 1) / gridDim.y);

    const u8* row_p[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            row_p[mt][h] = w + (i64)min(row0 + 16 * (rw * MT + mt) + 8 * h + g, n_rows - 1) * row_bytes;

    float c[MT][NT][4];
    zero_tiles(c);
    XSource<F> xsrc;
    xsrc.init(n_tok, n_cols);
    // code_pair's 0x64 bytes, from a value ptxas cannot fold (n_cols > 0): as an immediate it took the byte permute's
    // one immediate slot, and each selector was moved into a register first, one more instruction a pair
    const u32 high = 0x64646464u | ((u32)n_cols >> 31);

    // The lane's unit of super-step ss is 4 (ss KW + kw) + t, clamped into the row (x reads as zero past its end).
    const int unit0 = 4 * kw + t, last_unit = n_units - 1;
    auto fetch = [&](F (&slot)[MT][2], int ss) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) slot[mt][h].fetch(row_p[mt][h], min(4 * GM_KW * ss + unit0, last_unit));
    };
    // Super-step ss on x buffer `cur`, its weights in `slot` (fetched a super-step earlier), which then takes the
    // loads of super-step ss + 1. (A second slot, two super-steps in flight, was 7-30 % slower on the H100:
    // bench/results/gpu-s30-2026-12-07.md.)
    auto super_step = [&](int ss, int cur, F (&slot)[MT][2]) {
        cp_async_wait<0>();
        __syncthreads();  // this super-step's x has landed, and every warp is done with the other buffer
        if (ss + 1 < s_end)  // the next super-step's x and weights fly while this one is multiplied
            stage_x<F>(smem + (cur ^ 1) * XS_WORDS, x, xsrc, n_tok, n_cols, n_units, (ss + 1) * GM_KW);
        F f[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) f[mt][h] = slot[mt][h];
        if (ss + 1 < s_end) fetch(slot, ss + 1);  // loads alone: their first use is a later unpack
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) f[mt][h].unpack();
        const uint4* xw = smem + cur * XS_WORDS + kw * 4 * TOK * 4;

        float ca[MT][2][2], cb[MT][2][2];  // [m-tile][half][run]: w = a f + b
        u32 ha[MT][2][2], hb[MT][2][2];    // the same for the codes in float16 pairs (half_decode): w = a u + b
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                if constexpr (half_decode<F>()) {
                    float a0, b0, a1, b1;
                    f[mt][h].icoef(a0, b0, a1, b1);
                    ha[mt][h][0] = pack_h2_rn(a0, a0);
                    hb[mt][h][0] = pack_h2_rn(b0, b0);
                    ha[mt][h][1] = pack_h2_rn(a1, a1);
                    hb[mt][h][1] = pack_h2_rn(b1, b1);
                } else {
                    f[mt][h].coef(ca[mt][h][0], cb[mt][h][0], ca[mt][h][1], cb[mt][h][1]);
                }
            }
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            u32 a[MT][2][4];  // [m-tile][run]: the A fragment
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                if constexpr (half_decode<F>()) {
                    u32 c[2][2];  // [half][run]: the codes of weights 4k..4k+3, a byte each
                    f[mt][0].codes(k, c[0][0], c[0][1]);
                    f[mt][1].codes(k, c[1][0], c[1][1]);
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        a[mt][r][0] = code_pair<0x4140u>(c[0][r], high, ha[mt][0][r], hb[mt][0][r]);
                        a[mt][r][1] = code_pair<0x4140u>(c[1][r], high, ha[mt][1][r], hb[mt][1][r]);
                        a[mt][r][2] = code_pair<0x4342u>(c[0][r], high, ha[mt][0][r], hb[mt][0][r]);
                        a[mt][r][3] = code_pair<0x4342u>(c[1][r], high, ha[mt][1][r], hb[mt][1][r]);
                    }
                    continue;
                }
                float lo[2][4], hi[2][4];  // rows g and g + 8; [run][weight]
                f[mt][0].raw(k, lo[0], lo[1]);
                f[mt][1].raw(k, hi[0], hi[1]);
#pragma unroll
                for (int r = 0; r < 2; ++r) {
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        lo[r][i] = fmaf(ca[mt][0][r], lo[r][i], cb[mt][0][r]);
                        hi[r][i] = fmaf(ca[mt][1][r], hi[r][i], cb[mt][1][r]);
                    }
                    a[mt][r][0] = pack_h2_rn(lo[r][0], lo[r][1]);
                    a[mt][r][1] = pack_h2_rn(hi[r][0], hi[r][1]);
                    a[mt][r][2] = pack_h2_rn(lo[r][2], lo[r][3]);
                    a[mt][r][3] = pack_h2_rn(hi[r][2], hi[r][3]);
                }
            }
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const uint4 bv = xw[(k * TOK + 8 * nt + g) * 4 + t];  // one conflict-free 512-byte row a warp
                const u32 b0[2] = {bv.x, bv.y}, b1[2] = {bv.z, bv.w};
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma_16816(c[mt][nt], a[mt][0], b0);
                    mma_16816(c[mt][nt], a[mt][1], b1);
                }
            }
        }
    };
    F next[MT][2];
    if (s_begin < s_end) fetch(next, s_begin);
    after_previous_grid();  // the weights are no earlier kernel's output: their first loads fly during the wait
    if (s_begin < s_end) stage_x<F>(smem, x, xsrc, n_tok, n_cols, n_units, s_begin * GM_KW);
    for (int ss = s_begin; ss < s_end; ++ss) super_step(ss, (ss - s_begin) & 1, next);

    const bool keeps = gm_sum_column_warps<MT, NT, GM_KW>(c, reinterpret_cast<float*>(smem), kw, rw, GM_RW, lane);
#if GM_CLUSTER > 1
    cluster_sum_write<MT, NT>(c, keeps, reinterpret_cast<float*>(smem + PART_WORDS), rw, row0, n_rows, n_tok, y, ld_y,
                              col0, bias, lane);
#else
    if (!keeps) return;
    // Split 0 adds the bias; with splits the atomics add into the zeros the pre-pass wrote.
    gm_write<MT, NT>(c, row0 + 16 * rw * MT, n_rows, n_tok, y, ld_y, col0, blockIdx.y == 0 ? bias : nullptr,
                     gridDim.y > 1, lane);
#endif
}
}  // namespace gm2

// The pre-pass: `xh = float16(x)` (n elements, a multiple of 4: rows of whole units), and, where `y`
// is given, `y[:n_y] = 0` for the column splits to add into. One thread per 4 elements.
extern "C" __global__ void gemv_mma2_x16(const float* __restrict__ x, u32* __restrict__ xh, int n, float* __restrict__ y,
                                         int n_y) {
    after_previous_grid();
    const int stride = gridDim.x * blockDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n / 4; i += stride) {
        const float4 v = reinterpret_cast<const float4*>(x)[i];
        reinterpret_cast<uint2*>(xh)[i] = make_uint2(pack_h2_rn(v.x, v.y), pack_h2_rn(v.z, v.w));
    }
    if (y != nullptr)
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n_y; i += stride) y[i] = 0.f;
}

// `y[n, :] = x[n] @ [W0; W1; W2].T (+ bias)` for n < n_tok <= 8 NT, from `xh`, the float16 copy of x
// (gemv_mma2_x16); a weight with 0 rows is absent. Grid: (one block per gm2::ROWS rows of each
// weight, column splits); with splits > 1 and no cluster, y must be zero.
// GM_MIN_BLOCKS (an A/B build, PADDOCK_KERNEL_DEFINES): resident blocks a multiprocessor that ptxas must allow,
// i.e. a register cap; 0 leaves it to ptxas.
#ifndef GM_MIN_BLOCKS
#define GM_MIN_BLOCKS 0
#endif
#if GM_MIN_BLOCKS > 0
#define GM_BOUNDS __launch_bounds__(gm2::THREADS, GM_MIN_BLOCKS)
#else
#define GM_BOUNDS __launch_bounds__(gm2::THREADS)
#endif
#if GM_CLUSTER > 1
#define GM_KERNEL_ATTRS GM_BOUNDS __cluster_dims__(1, GM_CLUSTER, 1)
#else
#define GM_KERNEL_ATTRS GM_BOUNDS
#endif
extern "C" __global__ void GM_KERNEL_ATTRS
    gemv_mma2(const u8* __restrict__ w0, const u8* __restrict__ w1, const u8* __restrict__ w2, i64 row_bytes0,
              i64 row_bytes1, i64 row_bytes2, int rows0, int rows1, int rows2, int n_cols, const u16* __restrict__ x,
              int n_tok, float* __restrict__ y, const float* __restrict__ bias) {
    __shared__ uint4 smem[gm2::SMEM_WORDS];
    constexpr int ROWS = gm2::ROWS;
    const int tiles0 = (rows0 + ROWS - 1) / ROWS, tiles1 = (rows1 + ROWS - 1) / ROWS;
    const int ld_y = rows0 + rows1 + rows2;
    int tile = blockIdx.x;
    if constexpr (gm2::same<GM_F0, GM_F1>::value && gm2::same<GM_F1, GM_F2>::value) {
        // One format (gate/up, a single weight): one inlined copy of the tile, a third of the code.
        const int which = tile < tiles0 ? 0 : tile < tiles0 + tiles1 ? 1 : 2;
        const u8* w = which == 0 ? w0 : which == 1 ? w1 : w2;
        const i64 row_bytes = which == 0 ? row_bytes0 : which == 1 ? row_bytes1 : row_bytes2;
        const int rows = which == 0 ? rows0 : which == 1 ? rows1 : rows2;
        const int first = which == 0 ? 0 : which == 1 ? tiles0 : tiles0 + tiles1;
        const int col0 = which == 0 ? 0 : which == 1 ? rows0 : rows0 + rows1;
        gm2::tile<GM_F0>(w, row_bytes, rows, (tile - first) * ROWS, n_cols, x, n_tok, y, ld_y, col0, bias, smem);
        return;
    }
    if (tile < tiles0) {
        gm2::tile<GM_F0>(w0, row_bytes0, rows0, tile * ROWS, n_cols, x, n_tok, y, ld_y, 0, bias, smem);
        return;
    }
    tile -= tiles0;
    if (tile < tiles1) {
        gm2::tile<GM_F1>(w1, row_bytes1, rows1, tile * ROWS, n_cols, x, n_tok, y, ld_y, rows0, bias, smem);
        return;
    }
    tile -= tiles1;
    gm2::tile<GM_F2>(w2, row_bytes2, rows2, tile * ROWS, n_cols, x, n_tok, y, ld_y, rows0 + rows1, bias, smem);
}
