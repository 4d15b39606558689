// Split formats (safetensors FP8, NVFP4, MXFP4): codes in one buffer, their scales in another.
//
// The weight stays as the checkpoint stores it: `codes` holds each row's element codes (one
// float8_e4m3fn byte per weight, or two e2m1 nibbles per byte, the even element in the low
// nibble), `scales` the scale grid in its own dtype, scale [i, j] covering rows i*GR.. and
// columns j*GC.. (GC >= 16), and `global` multiplies every scale (NVFP4's tensor scale). The
// decoding is in registers, with no FP8/FP4 instructions, so it runs on every architecture:
// - e4m3 -> f16 by moving its bits into a half (sign to bit 15, exponent and mantissa to bits
//   7..13): the half's value is the e4m3 value / 256 for normals and subnormals alike, and the
//   factor 256 is folded into the unit's scale;
// - e2m1 through a 16-entry int8 table of doubled values (lut16 in quant_lowbit.cuh), the
//   halving folded into the scale.
// A unit is 16 weights of one row (16 code bytes, or 8), under one scale. The numpy oracle is
// app/engine/quant/split.py.
//
// gemv_split: y[t, r] = sum_c W[r, c] x[t, c] (+ bias[r]) for up to 8 tokens (compile-time bucket
// T). Each warp owns R rows and its lanes stride over the units, so every x value loaded (float4,
// from L1) serves R rows; the sums meet by warp shuffles. dequant_split: rows to float32/float16
// for the embedding gather and for the float16 tensor-core products of prefill.
#include "quant.cuh"
#include "store_out.cuh"

#define SPLIT_WARPS 4

// -- codes ---------------------------------------------------------------------------------

// CODE 0: float8_e4m3fn, 16 bytes a unit. Weights 4k..4k+3 of the unit (times 1/256) into w.
struct CodesE4M3 {
    static constexpr int UNIT_BYTES = 16;
    static constexpr float SCALE = 256.f;
    uint4 q;
    __device__ __forceinline__ void load(const u8* p) { q = __ldg(reinterpret_cast<const uint4*>(p)); }
    static __device__ __forceinline__ float2 pair(u32 two) {  // bytes 0 and 2 of `two` hold the codes
        const u32 h = ((two & 0x00800080u) << 8) | ((two & 0x007F007Fu) << 7);
        return make_float2(h2f_lo(h), h2f_hi(h));
    }
    __device__ __forceinline__ void get(int k, float* w) const {
        const u32 x = word4(q, k);
        const float2 a = pair(__byte_perm(x, 0u, 0x4140u)), b = pair(__byte_perm(x, 0u, 0x4342u));
        w[0] = a.x;
        w[1] = a.y;
        w[2] = b.x;
        w[3] = b.y;
    }
};

// CODE 1: e2m1 pairs, 8 bytes a unit; values doubled (integers), so SCALE halves them back.
struct CodesE2M1 {
    static constexpr int UNIT_BYTES = 8;
    static constexpr float SCALE = 0.5f;
    uint2 q;
    __device__ __forceinline__ void load(const u8* p) { q = __ldg(reinterpret_cast<const uint2*>(p)); }
    __device__ __forceinline__ void get(int k, float* w) const {
        // Weights 4k..4k+3 are the nibbles of bytes 2k and 2k+1: low, high, low, high.
        const u32 x = (k < 2 ? q.x : q.y) >> (16 * (k & 1));
        const u32 idx = (x & 0x0Fu) | ((x & 0xF0u) << 4) | ((x & 0x0F00u) << 8) | ((x & 0xF000u) << 12);
        const u32 v = lut16(idx, FmtMXFP4::T0, FmtMXFP4::T1, FmtMXFP4::T2, FmtMXFP4::T3);
        signed4(v, w);
    }
};

// -- scales --------------------------------------------------------------------------------

// SD 0: float32, 1: bfloat16, 2: float8_e4m3fn, 3: e8m0 (2^(e - 127)).
template <int SD>
__device__ __forceinline__ float scale_at(const u8* __restrict__ scales, i64 i) {
    if constexpr (SD == 0) {
        return __ldg(reinterpret_cast<const float*>(scales) + i);
    } else if constexpr (SD == 1) {
        return bf2f(__ldg(reinterpret_cast<const u16*>(scales) + i));
    } else if constexpr (SD == 2) {
        return CodesE4M3::pair((u32)__ldg(scales + i)).x * 256.f;
    } else {
        const u32 e = __ldg(scales + i);
        return __uint_as_float(e == 0 ? 0x00400000u : e << 23);
    }
}


// -- GEMV ----------------------------------------------------------------------------------

template <class C, int SD, int T, int R>
__device__ __forceinline__ void gemv_split_body(const u8* __restrict__ codes, i64 row_bytes,
                                                const u8* __restrict__ scales, int scale_cols, int group_rows,
                                                int group_cols, float global, int n_rows, int n_cols,
                                                const float* __restrict__ x, int n_tok, float* __restrict__ y,
                                                const float* __restrict__ bias) {
    after_previous_grid();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row0 = (blockIdx.x * SPLIT_WARPS + warp) * R;
    if (row0 >= n_rows) return;  // whole warps only: no block barrier below
    int rows[R];
#pragma unroll
    for (int r = 0; r < R; ++r) rows[r] = min(row0 + r, n_rows - 1);
    float acc[T][R];
#pragma unroll
    for (int t = 0; t < T; ++t)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[t][r] = 0.f;
    const float unit_factor = global * C::SCALE;
    for (int u = lane; u < (n_cols >> 4); u += 32) {
        C c[R];
        float s[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            c[r].load(codes + (i64)rows[r] * row_bytes + (i64)u * C::UNIT_BYTES);
            s[r] = scale_at<SD>(scales, (i64)(rows[r] / group_rows) * scale_cols + (u * 16) / group_cols) * unit_factor;
        }
        float part[T][R];
#pragma unroll
        for (int t = 0; t < T; ++t)
#pragma unroll
            for (int r = 0; r < R; ++r) part[t][r] = 0.f;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            float4 xv[T];
#pragma unroll
            for (int t = 0; t < T; ++t)
                xv[t] = t < n_tok ? __ldg(reinterpret_cast<const float4*>(x + (i64)t * n_cols + u * 16 + 4 * k))
                                  : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int r = 0; r < R; ++r) {
                float w[4];
                c[r].get(k, w);
#pragma unroll
                for (int t = 0; t < T; ++t) {
                    float a = part[t][r];
                    a = fmaf(w[0], xv[t].x, a);
                    a = fmaf(w[1], xv[t].y, a);
                    a = fmaf(w[2], xv[t].z, a);
                    a = fmaf(w[3], xv[t].w, a);
                    part[t][r] = a;
                }
            }
        }
#pragma unroll
        for (int t = 0; t < T; ++t)
#pragma unroll
            for (int r = 0; r < R; ++r) acc[t][r] = fmaf(s[r], part[t][r], acc[t][r]);
    }
#pragma unroll
    for (int t = 0; t < T; ++t)
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float v = warp_sum(acc[t][r]);
            const int row = row0 + r;
            if (lane == 0 && t < n_tok && row < n_rows) y[(i64)t * n_rows + row] = v + (bias != nullptr ? bias[row] : 0.f);
        }
}

#define GEMV_SPLIT_KERNEL(CNAME, C, SD, T, R)                                                                      \
    extern "C" __global__ void __launch_bounds__(32 * SPLIT_WARPS) gemv_split_##CNAME##_s##SD##_t##T##_r##R(      \
        const u8* __restrict__ codes, i64 row_bytes, const u8* __restrict__ scales, int scale_cols,                \
        int group_rows, int group_cols, float global, int n_rows, int n_cols, const float* __restrict__ x,         \
        int n_tok, float* __restrict__ y, const float* __restrict__ bias) {                                        \
        gemv_split_body<C, SD, T, R>(codes, row_bytes, scales, scale_cols, group_rows, group_cols, global, n_rows, \
                                     n_cols, x, n_tok, y, bias);                                                  \
    }

// -- dequantize ----------------------------------------------------------------------------

// One thread per unit of output row i: source row ids[i] (clamped into the tensor) or row_offset + i.
template <class C, int SD, class Out>
__device__ __forceinline__ void dequant_split_body(const u8* __restrict__ codes, i64 row_bytes,
                                                   const u8* __restrict__ scales, int scale_cols, int group_rows,
                                                   int group_cols, float global, int n_cols,
                                                   const int* __restrict__ ids, int n_out, int row_offset,
                                                   int n_src_rows, typename Out::T* __restrict__ y) {
    after_previous_grid();
    const int units = n_cols >> 4;
    const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (i64)n_out * units) return;
    const int i = (int)(idx / units), u = (int)(idx % units);
    int src = ids != nullptr ? ids[i] : row_offset + i;
    src = min(max(src, 0), n_src_rows - 1);
    C c;
    c.load(codes + (i64)src * row_bytes + (i64)u * C::UNIT_BYTES);
    const float s = scale_at<SD>(scales, (i64)(src / group_rows) * scale_cols + (u * 16) / group_cols) * (global * C::SCALE);
    typename Out::T* out = y + (i64)i * n_cols + u * 16;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        float w[4];
        c.get(k, w);
#pragma unroll
        for (int j = 0; j < 4; ++j) w[j] *= s;
        Out::store4(out + 4 * k, w);
    }
}

#define DEQUANT_SPLIT_KERNEL(CNAME, C, SD, OUTNAME, OUT)                                                          \
    extern "C" __global__ void __launch_bounds__(256) dequant_split_##CNAME##_s##SD##_##OUTNAME(                  \
        const u8* __restrict__ codes, i64 row_bytes, const u8* __restrict__ scales, int scale_cols,               \
        int group_rows, int group_cols, float global, int n_cols, const int* __restrict__ ids, int n_out,         \
        int row_offset, int n_src_rows, OUT::T* __restrict__ y) {                                                 \
        dequant_split_body<C, SD, OUT>(codes, row_bytes, scales, scale_cols, group_rows, group_cols, global,      \
                                       n_cols, ids, n_out, row_offset, n_src_rows, y);                            \
    }

// One (codes, scale dtype) pair: every token bucket (rows per warp from the tuning: 4, 2) and both outputs.
#define SPLIT_VARIANTS(CNAME, C, SD)             \
    GEMV_SPLIT_KERNEL(CNAME, C, SD, 1, 4)        \
    GEMV_SPLIT_KERNEL(CNAME, C, SD, 1, 2)        \
    GEMV_SPLIT_KERNEL(CNAME, C, SD, 2, 4)        \
    GEMV_SPLIT_KERNEL(CNAME, C, SD, 4, 2)        \
    GEMV_SPLIT_KERNEL(CNAME, C, SD, 8, 2)        \
    DEQUANT_SPLIT_KERNEL(CNAME, C, SD, f32, OutF32) \
    DEQUANT_SPLIT_KERNEL(CNAME, C, SD, f16, OutF16)

// The wrapper compiles one pair per module (-DSPLIT_CODES=e4m3 -DSPLIT_CODES_STRUCT=CodesE4M3
// -DSPLIT_SCALE=0); the compile check builds all of them: FP8 with float32/bfloat16 scales,
// NVFP4 with e4m3 scales, MXFP4 with e8m0 scales.
#if defined(PADDOCK_ALL_VARIANTS)
SPLIT_VARIANTS(e4m3, CodesE4M3, 0)
SPLIT_VARIANTS(e4m3, CodesE4M3, 1)
SPLIT_VARIANTS(e2m1, CodesE2M1, 2)
SPLIT_VARIANTS(e2m1, CodesE2M1, 3)
#else
SPLIT_VARIANTS(SPLIT_CODES, SPLIT_CODES_STRUCT, SPLIT_SCALE)
#endif
