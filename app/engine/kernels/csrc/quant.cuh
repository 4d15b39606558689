// GGUF block formats, decoded straight from their file layout.
//
// Every format is read in "units" of 32 weights of one row: two runs of 16 consecutive
// weights, the second starting RUN1 weights after the first. The unit is the natural
// slice of each format (one block of the 32-weight formats; one eighth of a 256-weight
// k-quant block, chosen so that its quants are 16 contiguous bytes), so a lane fetches
// a unit with one or two 16-byte loads. `load(row, u)` fetches unit `u` of a row (raw
// bytes plus its scales) into registers; `get(k, w0, w1)` returns weights 4k..4k+3 of
// each run (k = 0..3, a compile-time constant after unrolling); `x_base(u)` is the
// column of the unit's first weight. The numpy dequantizers in quant/reference.py are
// the oracle for every format here.
//
// The GEMV kernels use a cheaper pair instead of get(): `raw(k, f0, f1)` returns codes
// f with sum_run(w * x) = a * sum_run(f * x) + b * sum_run(x), the per-run (a, b) from
// `coef()`. For the small-integer formats f = 0.5 + u/256 is built from the quant u with
// one byte permute (no int-to-float conversion, a quarter-rate instruction); the
// affine terms are applied once per 16 weights. Float formats have AFFINE = false.
//
// The integer formats also give their quants as packed int8 codes for dp4a (gemv_q8.cuh):
// `codes(k, c0, c1)` returns the codes of weights 4k..4k+3 of each run, four to a word,
// and `icoef()` the per-run (a, b) with w = a * code + b. raw() and coef() follow from
// them (IntCodes below), except for Q8_0, whose signed codes take another float trick.
#pragma once
#include "common.cuh"

__device__ __forceinline__ u32 word4(uint4 v, int k) { return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w; }

// 0.5 + u/256 for byte i of w (u < 128): the byte becomes bits 16..23 of 0x3F000000.
__device__ __forceinline__ float biased(u32 w, int i) {
    return __uint_as_float(__byte_perm(w, 0x3F000000u, 0x7044u | ((u32)i << 8)));
}

// Signed byte i of w, exactly: (b ^ 0x80) in the low bits of 2^23, minus 2^23 + 128.
__device__ __forceinline__ float signed_byte(u32 w, int i) {
    return __uint_as_float(__byte_perm(w ^ 0x80808080u, 0x4B000000u, 0x7440u | (u32)i)) - 8388736.f;
}

// Bits 0..3 of n moved to bit 0 of bytes 0..3 (one multiply; the partial products never collide).
__device__ __forceinline__ u32 spread4(u32 n) { return ((n & 15u) * 0x00204081u) & 0x01010101u; }

__device__ __forceinline__ void biased4(u32 lo, u32 hi, float* f0, float* f1) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f0[i] = biased(lo, i);
        f1[i] = biased(hi, i);
    }
}

// raw() and coef() of a format with unsigned codes below 128: f = 0.5 + u/256 is one byte
// permute per code, and w = a u + b = 256 a f + (b - 128 a).
template <class Self>
struct IntCodes {
    static constexpr bool AFFINE = true;
    // fetch() issues a unit's loads and unpack() turns them into what get()/codes()/coef() read; load() is both.
    // A pipelined caller (gemv_mma2.cu) fetches the next step's unit before it multiplies this one and unpacks it
    // after: done in load(), the scale arithmetic waits on the loads there and the warp stalls for DRAM before it
    // multiplies. A format defines either fetch() and unpack() (load() is then this default) or, where its load()
    // is plain loads, load() alone (fetch() and unpack() are then these).
    __device__ __forceinline__ void load(const u8* row, int u) {
        static_cast<Self*>(this)->fetch(row, u);
        static_cast<Self*>(this)->unpack();
    }
    __device__ __forceinline__ void fetch(const u8* row, int u) { static_cast<Self*>(this)->load(row, u); }
    __device__ __forceinline__ void unpack() {}
    __device__ __forceinline__ void raw(int k, float* f0, float* f1) const {
        u32 c0, c1;
        static_cast<const Self*>(this)->codes(k, c0, c1);
        biased4(c0, c1, f0, f1);
    }
    __device__ __forceinline__ void coef(float& a0, float& b0, float& a1, float& b1) const {
        static_cast<const Self*>(this)->icoef(a0, b0, a1, b1);
        b0 -= 128.f * a0;
        a0 *= 256.f;
        b1 -= 128.f * a1;
        a1 *= 256.f;
    }
};

// -- 32-weight blocks ----------------------------------------------------------------------

struct FmtQ4_0 : IntCodes<FmtQ4_0> {  // d:f16, qs[16]: w = d * (q - 8); low nibbles are weights 0..15
    static constexpr int RUN1 = 16;
    static __device__ __forceinline__ int x_base(int u) { return u * 32; }
    float d;
    uint4 q;
    u16 dh;
    __device__ __forceinline__ void fetch(const u8* row, int u) {
        const u8* b = row + u * 18;
        dh = ld_u16(b);
        q = ld16u(b + 2);
    }
    __device__ __forceinline__ void unpack() { d = h2f(dh); }
    __device__ __forceinline__ void get(int k, float* w0, float* w1) const {
        const u32 x = word4(q, k);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            w0[i] = d * (float)((int)(ubyte(x, i) & 15u) - 8);
            w1[i] = d * (float)((int)(ubyte(x, i) >> 4) - 8);
        }
    }
    __device__ __forceinline__ void codes(int k, u32& c0, u32& c1) const {
        const u32 x = word4(q, k);
        c0 = x & 0x0F0F0F0Fu;
        c1 = (x >> 4) & 0x0F0F0F0Fu;
    }
    __device__ __forceinline__ void icoef(float& a0, float& b0, float& a1, float& b1) const {
        a0 = a1 = d;  // w = d * (u - 8)
        b0 = b1 = -8.f * d;
    }
};

struct FmtQ4_1 : IntCodes<FmtQ4_1> {  // d:f16, m:f16, qs[16]: w = d * q + m
    static constexpr int RUN1 = 16;
    static __device__ __forceinline__ int x_base(int u) { return u * 32; }
    float d, m;
    uint4 q;
    __device__ __forceinline__ void load(const u8* row, int u) {
        const u8* b = row + u * 20;
        d = h2f(ld_u16(b));
        m = h2f(ld_u16(b + 2));
        q = ld16u(b + 4);
    }
    __device__ __forceinline__ void get(int k, float* w0, float* w1) const {
        const u32 x = word4(q, k);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            w0[i] = d * (float)(ubyte(x, i) & 15u) + m;
            w1[i] = d * (float)(ubyte(x, i) >> 4) + m;
        }
    }
    __device__ __forceinline__ void codes(int k, u32& c0, u32& c1) const {
        const u32 x = word4(q, k);
        c0 = x & 0x0F0F0F0Fu;
        c1 = (x >> 4) & 0x0F0F0F0Fu;
    }
    __device__ __forceinline__ void icoef(float& a0, float& b0, float& a1, float& b1) const {
        a0 = a1 = d;  // w = d * u + m
        b0 = b1 = m;
    }
};

struct FmtQ5_0 : IntCodes<FmtQ5_0> {  // d:f16, qh:u32 (bit j = 5th bit of weight j), qs[16]: w = d * (q - 16)
    static constexpr int RUN1 = 16;
    static __device__ __forceinline__ int x_base(int u) { return u * 32; }
    float d;
    u32 qh;
    uint4 q;
    __device__ __forceinline__ void load(const u8* row, int u) {
        const u8* b = row + u * 22;
        d = h2f(ld_u16(b));
        qh = ld_u32_a2(b + 2);
        q = ld16u(b + 6);
    }
    __device__ __forceinline__ void get(int k, float* w0, float* w1) const {
        const u32 x = word4(q, k);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int j = 4 * k + i;
            const u32 lo = (ubyte(x, i) & 15u) | (((qh >> j) & 1u) << 4);
            const u32 hi = (ubyte(x, i) >> 4) | (((qh >> (j + 16)) & 1u) << 4);
            w0[i] = d * (float)((int)lo - 16);
            w1[i] = d * (float)((int)hi - 16);
        }
    }
    __device__ __forceinline__ void codes(int k, u32& c0, u32& c1) const {
        const u32 x = word4(q, k);
        c0 = (x & 0x0F0F0F0Fu) | (spread4(qh >> (4 * k)) << 4);
        c1 = ((x >> 4) & 0x0F0F0F0Fu) | (spread4(qh >> (16 + 4 * k)) << 4);
    }
    __device__ __forceinline__ void icoef(float& a0, float& b0, float& a1, float& b1) const {
        a0 = a1 = d;  // w = d * (u - 16)
        b0 = b1 = -16.f * d;
    }
};

struct FmtQ5_1 : IntCodes<FmtQ5_1> {  // d:f16, m:f16, qh:u32, qs[16]: w = d * q + m
    static constexpr int RUN1 = 16;
    static __device__ __forceinline__ int x_base(int u) { return u * 32; }
    float d, m;
    u32 qh;
    uint4 q;
    __device__ __forceinline__ void load(const u8* row, int u) {
        const u8* b = row + u * 24;
        d = h2f(ld_u16(b));
        m = h2f(ld_u16(b + 2));
        qh = ld_u32_a2(b + 4);
        q = ld16u(b + 8);
    }
    __device__ __forceinline__ void get(int k, float* w0, float* w1) const {
        const u32 x = word4(q, k);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int j = 4 * k + i;
            const u32 lo = (ubyte(x, i) & 15u) | (((qh >> j) & 1u) << 4);
            const u32 hi = (ubyte(x, i) >> 4) | (((qh >> (j + 16)) & 1u) << 4);
            w0[i] = d * (float)lo + m;
            w1[i] = d * (float)hi + m;
        }
    }
    __device__ __forceinline__ void codes(int k, u32& c0, u32& c1) const {
        const u32 x = word4(q, k);
        c0 = (x & 0x0F0F0F0Fu) | (spread4(qh >> (4 * k)) << 4);
        c1 = ((x >> 4) & 0x0F0F0F0Fu) | (spread4(qh >> (16 + 4 * k)) << 4);
    }
    __device__ __forceinline__ void icoef(float& a0, float& b0, float& a1, float& b1) const {
        a0 = a1 = d;  // w = d * u + m
        b0 = b1 = m;
    }
};

struct FmtQ8_0 {  // d:f16, qs[32] int8: w = d * q
    static constexpr int RUN1 = 16;
    static __device__ __forceinline__ int x_base(int u) { return u * 32; }
    float d;
    uint4 q0, q1;
    u16 dh;
    __device__ __forceinline__ void fetch(const u8* row, int u) {  // IntCodes' fetch()/unpack(), for int8 codes
        const u8* b = row + u * 34;
        dh = ld_u16(b);
        q0 = ld16u(b + 2);
        q1 = ld16u(b + 18);
    }
    __device__ __forceinline__ void unpack() { d = h2f(dh); }
    __device__ __forceinline__ void load(const u8* row, int u) {
        fetch(row, u);
        unpack();
    }
    __device__ __forceinline__ void get(int k, float* w0, float* w1) const {
        const u32 x0 = word4(q0, k), x1 = word4(q1, k);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            w0[i] = d * (float)sbyte(x0, i);
            w1[i] = d * (float)sbyte(x1, i);
        }
    }
    __device__ __forceinline__ void codes(int k, u32& c0, u32& c1) const {  // signed codes
        c0 = word4(q0, k);
        c1 = word4(q1, k);
    }
    __device__ __forceinline__ void icoef(float& a0, float& b0, float& a1, float& b1) const {
        a0 = a1 = d;
        b0 = b1 = 0.f;
    }
    static constexpr bool AFFINE = true;
    __device__ __forceinline__ void raw(int k, float* f0, float* f1) const {
        const u32 x0 = word4(q0, k), x1 = word4(q1, k);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            f0[i] = signed_byte(x0, i);
            f1[i] = signed_byte(x1, i);
        }
    }
    __device__ __forceinline__ void coef(float& a0, float& b0, float& a1, float& b1) const {
        a0 = a1 = d;  // the codes are the exact quants
        b0 = b1 = 0.f;
    }
};

// -- 256-weight k-quant super-blocks --------------------------------------------------------

// 6-bit scales and mins of the sub-block pair (2p, 2p + 1), p = 0..3, from the 12 packed
// bytes of Q4_K/Q5_K held in words y (bytes 0..3), z (4..7), w (8..11). Sub-blocks 0..3 keep
// their scale in bytes 0..3 and min in 4..7 (low 6 bits); 4..7 split theirs into a nibble of
// bytes 8..11 plus the top 2 bits of bytes 0..3 (scale) or 4..7 (min). One byte permute
// selector serves both halves, and both are computed and selected: the lanes of a warp read
// different pairs, so a branch on p would run both sides one after the other anyway.
__device__ __forceinline__ void kquant_scale_min_pair(u32 y, u32 z, u32 w, int p, u32& sa, u32& ma, u32& sb,
                                                      u32& mb) {
    const u32 q2 = (u32)(2 * (p & 1));
    const u32 sel = q2 | ((q2 + 1) << 4) | ((q2 + 4) << 8) | ((q2 + 5) << 12);
    const u32 t = __byte_perm(y, z, sel);  // scales of 2p, 2p+1 then mins (p < 2), or their top bits (p >= 2)
    const u32 g = __byte_perm(w, w, sel);  // p >= 2: low nibble scale, high nibble min, of 2p and 2p+1
    const u32 high = (g & 0x00000F0Fu) | ((g >> 4) & 0x0F0F0000u) | ((t >> 2) & 0x30303030u);
    const u32 v = p < 2 ? (t & 0x3F3F3F3Fu) : high;
    sa = v & 0xffu;
    sb = (v >> 8) & 0xffu;
    ma = (v >> 16) & 0xffu;
    mb = v >> 24;
}

// Q4_K (144 bytes): d, dmin, scales[12], qs[128]. Unit (j, h) of a block: qs bytes
// 32j + 16h .. +16; low nibbles are weights 64j + 16h + (0..15) in sub-block 2j, high
// nibbles the same 32 weights later in sub-block 2j + 1.
struct FmtQ4_K : IntCodes<FmtQ4_K> {
    static constexpr int RUN1 = 32;
    static __device__ __forceinline__ int x_base(int u) {
        const int s = u & 7;
        return (u >> 3) * 256 + (s >> 1) * 64 + (s & 1) * 16;
    }
    float s0, m0, s1, m1;
    uint4 q, hdr;
    int j;
    __device__ __forceinline__ void fetch(const u8* row, int u) {
        const u8* b = row + (u >> 3) * 144;
        const int s = u & 7, h = s & 1;
        j = s >> 1;
        hdr = ld16(b);  // 144-byte blocks in 16-aligned rows: always aligned
        q = ld16(b + 16 + j * 32 + h * 16);
    }
    __device__ __forceinline__ void unpack() {
        const float d = h2f_lo(hdr.x), dmin = h2f_hi(hdr.x);
        u32 sa, ma, sb, mb;
        kquant_scale_min_pair(hdr.y, hdr.z, hdr.w, j, sa, ma, sb, mb);
        s0 = d * (float)sa;
        m0 = dmin * (float)ma;
        s1 = d * (float)sb;
        m1 = dmin * (float)mb;
    }
    __device__ __forceinline__ void get(int k, float* w0, float* w1) const {
        const u32 x = word4(q, k);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            w0[i] = s0 * (float)(ubyte(x, i) & 15u) - m0;
            w1[i] = s1 * (float)(ubyte(x, i) >> 4) - m1;
        }
    }
    __device__ __forceinline__ void codes(int k, u32& c0, u32& c1) const {
        const u32 x = word4(q, k);
        c0 = x & 0x0F0F0F0Fu;
        c1 = (x >> 4) & 0x0F0F0F0Fu;
    }
    __device__ __forceinline__ void icoef(float& a0, float& b0, float& a1, float& b1) const {
        a0 = s0;  // w = s u - m
        b0 = -m0;
        a1 = s1;
        b1 = -m1;
    }
};

// Q5_K (176 bytes): d, dmin, scales[12], qh[32], qs[128]. As Q4_K, plus a fifth bit:
// byte l of qh holds it at bit 2j for weight 64j + l and at bit 2j + 1 for 64j + 32 + l.
struct FmtQ5_K : IntCodes<FmtQ5_K> {
    static constexpr int RUN1 = 32;
    static __device__ __forceinline__ int x_base(int u) { return FmtQ4_K::x_base(u); }
    float s0, m0, s1, m1;
    int j2;
    uint4 q, qh, hdr;
    __device__ __forceinline__ void fetch(const u8* row, int u) {
        const u8* b = row + (u >> 3) * 176;
        const int s = u & 7, j = s >> 1, h = s & 1;
        hdr = ld16(b);
        qh = ld16(b + 16 + h * 16);
        q = ld16(b + 48 + j * 32 + h * 16);
        j2 = 2 * j;
    }
    __device__ __forceinline__ void unpack() {
        const float d = h2f_lo(hdr.x), dmin = h2f_hi(hdr.x);
        u32 sa, ma, sb, mb;
        kquant_scale_min_pair(hdr.y, hdr.z, hdr.w, j2 >> 1, sa, ma, sb, mb);
        s0 = d * (float)sa;
        m0 = dmin * (float)ma;
        s1 = d * (float)sb;
        m1 = dmin * (float)mb;
    }
    __device__ __forceinline__ void get(int k, float* w0, float* w1) const {
        const u32 x = word4(q, k), hb = word4(qh, k) >> j2;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 lo = (ubyte(x, i) & 15u) | ((ubyte(hb, i) & 1u) << 4);
            const u32 hi = (ubyte(x, i) >> 4) | (((ubyte(hb, i) >> 1) & 1u) << 4);
            w0[i] = s0 * (float)lo - m0;
            w1[i] = s1 * (float)hi - m1;
        }
    }
    __device__ __forceinline__ void codes(int k, u32& c0, u32& c1) const {
        const u32 x = word4(q, k), hb = word4(qh, k) >> j2;
        c0 = (x & 0x0F0F0F0Fu) | ((hb & 0x01010101u) << 4);
        c1 = ((x >> 4) & 0x0F0F0F0Fu) | ((hb & 0x02020202u) << 3);
    }
    __device__ __forceinline__ void icoef(float& a0, float& b0, float& a1, float& b1) const {
        a0 = s0;
        b0 = -m0;
        a1 = s1;
        b1 = -m1;
    }
};

// Q6_K (210 bytes): ql[128], qh[64], scales[16] int8, d. Half n (128 weights) uses ql
// bytes 64n.., qh bytes 32n.., scales 8n... Unit (n, part, lh): ql bytes
// 64n + 32part + 16lh .. +16 and qh bytes 32n + 16lh .. +16; low nibbles (qh bits
// 2part..) are weights 128n + 32part + 16lh + (0..15), high nibbles (qh bits 4 + 2part..)
// the same 64 weights later. Blocks are only 2-byte aligned, hence ld16u.
struct FmtQ6_K : IntCodes<FmtQ6_K> {
    static constexpr int RUN1 = 64;
    static __device__ __forceinline__ int x_base(int u) {
        const int s = u & 7;
        return (u >> 3) * 256 + (s >> 2) * 128 + ((s >> 1) & 1) * 32 + (s & 1) * 16;
    }
    float s0, s1;
    int sh0;
    uint4 ql, qh;
    signed char sc0, sc1;  // the unit's two scales: its bytes of scales[16], not the whole 16 (two unaligned loads)
    u16 dh;
    __device__ __forceinline__ void fetch(const u8* row, int u) {
        const u8* b = row + (u >> 3) * 210;
        const int s = u & 7, n = s >> 2, part = (s >> 1) & 1, lh = s & 1;
        ql = ld16u(b + n * 64 + part * 32 + lh * 16);
        qh = ld16u(b + 128 + n * 32 + lh * 16);
        const int base = n * 8 + lh + part * 2;
        sc0 = (signed char)__ldg(b + 192 + base);
        sc1 = (signed char)__ldg(b + 196 + base);
        dh = ld_u16(b + 208);
        sh0 = part * 2;
    }
    __device__ __forceinline__ void unpack() {
        const float d = h2f(dh);
        s0 = d * (float)sc0;
        s1 = d * (float)sc1;
    }
    __device__ __forceinline__ void get(int k, float* w0, float* w1) const {
        const u32 x = word4(ql, k), hb = word4(qh, k) >> sh0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 h = ubyte(hb, i);
            const int lo = (int)((ubyte(x, i) & 15u) | ((h & 3u) << 4)) - 32;
            const int hi = (int)((ubyte(x, i) >> 4) | (((h >> 4) & 3u) << 4)) - 32;
            w0[i] = s0 * (float)lo;
            w1[i] = s1 * (float)hi;
        }
    }
    __device__ __forceinline__ void codes(int k, u32& c0, u32& c1) const {
        const u32 x = word4(ql, k), hb = word4(qh, k) >> sh0;
        c0 = (x & 0x0F0F0F0Fu) | ((hb & 0x03030303u) << 4);
        c1 = ((x >> 4) & 0x0F0F0F0Fu) | (((hb >> 4) & 0x03030303u) << 4);
    }
    __device__ __forceinline__ void icoef(float& a0, float& b0, float& a1, float& b1) const {
        a0 = s0;  // w = s * (u - 32)
        b0 = -32.f * s0;
        a1 = s1;
        b1 = -32.f * s1;
    }
};

// -- float formats (rows of a whole number of 32-weight units, so 16-byte aligned) --------

struct FmtF16 {
    static constexpr int RUN1 = 16;
    static __device__ __forceinline__ int x_base(int u) { return u * 32; }
    uint4 a0, a1, b0, b1;  // the first run of 16 weights: a0, a1; the second: b0, b1
    __device__ __forceinline__ void load(const u8* row, int u) {
        const u8* p = row + u * 64;
        a0 = ld16(p);
        a1 = ld16(p + 16);
        b0 = ld16(p + 32);
        b1 = ld16(p + 48);
    }
    __device__ __forceinline__ void fetch(const u8* row, int u) { load(row, u); }  // loads alone: no split
    __device__ __forceinline__ void unpack() {}
    __device__ __forceinline__ void get(int k, float* w0, float* w1) const {
        const uint4 a = k < 2 ? a0 : a1, b = k < 2 ? b0 : b1;
        const u32 alo = (k & 1) ? a.z : a.x, ahi = (k & 1) ? a.w : a.y;
        const u32 blo = (k & 1) ? b.z : b.x, bhi = (k & 1) ? b.w : b.y;
        w0[0] = h2f_lo(alo); w0[1] = h2f_hi(alo); w0[2] = h2f_lo(ahi); w0[3] = h2f_hi(ahi);
        w1[0] = h2f_lo(blo); w1[1] = h2f_hi(blo); w1[2] = h2f_lo(bhi); w1[3] = h2f_hi(bhi);
    }
    static constexpr bool AFFINE = false;
    __device__ __forceinline__ void raw(int k, float* f0, float* f1) const { get(k, f0, f1); }
    __device__ __forceinline__ void coef(float& a0, float& b0, float& a1, float& b1) const {
        a0 = a1 = 1.f;
        b0 = b1 = 0.f;
    }
};

struct FmtBF16 {
    static constexpr int RUN1 = 16;
    static __device__ __forceinline__ int x_base(int u) { return u * 32; }
    uint4 a0, a1, b0, b1;
    __device__ __forceinline__ void load(const u8* row, int u) {
        const u8* p = row + u * 64;
        a0 = ld16(p);
        a1 = ld16(p + 16);
        b0 = ld16(p + 32);
        b1 = ld16(p + 48);
    }
    __device__ __forceinline__ void fetch(const u8* row, int u) { load(row, u); }  // loads alone: no split
    __device__ __forceinline__ void unpack() {}
    __device__ __forceinline__ void get(int k, float* w0, float* w1) const {
        const uint4 a = k < 2 ? a0 : a1, b = k < 2 ? b0 : b1;
        const u32 alo = (k & 1) ? a.z : a.x, ahi = (k & 1) ? a.w : a.y;
        const u32 blo = (k & 1) ? b.z : b.x, bhi = (k & 1) ? b.w : b.y;
        w0[0] = __uint_as_float(alo << 16); w0[1] = __uint_as_float(alo & 0xffff0000u);
        w0[2] = __uint_as_float(ahi << 16); w0[3] = __uint_as_float(ahi & 0xffff0000u);
        w1[0] = __uint_as_float(blo << 16); w1[1] = __uint_as_float(blo & 0xffff0000u);
        w1[2] = __uint_as_float(bhi << 16); w1[3] = __uint_as_float(bhi & 0xffff0000u);
    }
    static constexpr bool AFFINE = false;
    __device__ __forceinline__ void raw(int k, float* f0, float* f1) const { get(k, f0, f1); }
    __device__ __forceinline__ void coef(float& a0, float& b0, float& a1, float& b1) const {
        a0 = a1 = 1.f;
        b0 = b1 = 0.f;
    }
};

struct FmtF32 {  // 128 bytes a unit: read in get(), too many registers to hold ahead
    static constexpr int RUN1 = 16;
    static __device__ __forceinline__ int x_base(int u) { return u * 32; }
    const float4* p;
    __device__ __forceinline__ void load(const u8* row, int u) {
        p = reinterpret_cast<const float4*>(row + u * 128);
    }
    __device__ __forceinline__ void fetch(const u8* row, int u) { load(row, u); }  // loads alone: no split
    __device__ __forceinline__ void unpack() {}
    __device__ __forceinline__ void get(int k, float* w0, float* w1) const {
        const float4 a = __ldg(p + k), b = __ldg(p + 4 + k);
        w0[0] = a.x; w0[1] = a.y; w0[2] = a.z; w0[3] = a.w;
        w1[0] = b.x; w1[1] = b.y; w1[2] = b.z; w1[3] = b.w;
    }
    static constexpr bool AFFINE = false;
    __device__ __forceinline__ void raw(int k, float* f0, float* f1) const { get(k, f0, f1); }
    __device__ __forceinline__ void coef(float& a0, float& b0, float& a1, float& b1) const {
        a0 = a1 = 1.f;
        b0 = b1 = 0.f;
    }
};

// One line per format: FORMAT(suffix used in kernel names, decoder struct). The integer
// formats (codes() and icoef(), for gemv_int.cuh) are listed on their own as well.
#define PADDOCK_INT_FORMATS(FORMAT) \
    FORMAT(q4_0, FmtQ4_0)           \
    FORMAT(q4_1, FmtQ4_1)           \
    FORMAT(q5_0, FmtQ5_0)           \
    FORMAT(q5_1, FmtQ5_1)           \
    FORMAT(q8_0, FmtQ8_0)           \
    FORMAT(q4_k, FmtQ4_K)           \
    FORMAT(q5_k, FmtQ5_K)           \
    FORMAT(q6_k, FmtQ6_K)

#define PADDOCK_FORMATS(FORMAT) \
    FORMAT(f32, FmtF32)         \
    FORMAT(f16, FmtF16)         \
    FORMAT(bf16, FmtBF16)       \
    PADDOCK_INT_FORMATS(FORMAT) \
    PADDOCK_LOWBIT_FORMATS(FORMAT)

// MXFP4, NVFP4, IQ4_NL, IQ4_XS: table-lookup formats, float-x GEMV and dequantize only (quant_lowbit.cuh).
#include "quant_lowbit.cuh"
#define PADDOCK_LOWBIT_FORMATS(FORMAT) \
    FORMAT(mxfp4, FmtMXFP4)            \
    FORMAT(nvfp4, FmtNVFP4)            \
    FORMAT(iq4_nl, FmtIQ4_NL)          \
    FORMAT(iq4_xs, FmtIQ4_XS)
