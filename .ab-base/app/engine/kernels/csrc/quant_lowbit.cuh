// GGUF's table-lookup 4-bit formats, decoded from their file layout: MXFP4, NVFP4, IQ4_NL, IQ4_XS.
//
// Each nibble indexes a 16-entry table of small integers (ggml's kvalues_mxfp4: e2m1 doubled;
// kvalues_iq4nl), scaled per block. The tables are held as four words of int8 and read with
// two byte permutes per four nibbles (lut16); the GEMV then multiplies exact integer-valued
// floats by x and applies the block scale once per run (raw() = table value, coef() = (d, 0)).
// codes() / icoef() give the same values as int8 codes (the int16-x MoE products, moe.cu).
// In every 32 weights, the low nibbles of 16 bytes are weights 0..15 and the high nibbles
// weights 16..31, so a unit is 32 weights in two runs of 16 (RUN1 = 16). The numpy oracles are
// app/engine/quant/lowbit.py. Included by quant.cuh, which lists these formats in PADDOCK_FORMATS.
#pragma once

// Byte i of `idx` (each 0..15) replaced by entry idx_i of the int8 table t0..t3 (entries 4j..4j+3 in tj).
__device__ __forceinline__ u32 lut16(u32 idx, u32 t0, u32 t1, u32 t2, u32 t3) {
    const u32 low3 = idx & 0x07070707u;
    const u32 packed = low3 | (low3 >> 4);  // selector nibbles: byte 0 -> bits 0..3, 1 -> 4..7, ...
    const u32 sel = (packed & 0xFFu) | ((packed >> 8) & 0xFF00u);
    const u32 lo = __byte_perm(t0, t1, sel), hi = __byte_perm(t2, t3, sel);
    const u32 upper = ((idx >> 3) & 0x01010101u) * 0xFFu;  // entries 8..15 come from t2, t3
    return (lo & ~upper) | (hi & upper);
}

// The four signed table bytes of `v` as floats (exact: |v| < 128).
__device__ __forceinline__ void signed4(u32 v, float* f) {
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = signed_byte(v, i);
}

// Shared by the three formats: 16 bytes of nibbles `q`, one scale `d0` for run 0 and `d1` for run 1.
template <class Self>
struct Lut4 {
    static constexpr int RUN1 = 16;
    static constexpr bool AFFINE = true;
    // quant.cuh's fetch() / unpack() pair (a pipelined caller's loads apart from their arithmetic): load() whole
    __device__ __forceinline__ void fetch(const u8* row, int u) { static_cast<Self*>(this)->load(row, u); }
    __device__ __forceinline__ void unpack() {}
    __device__ __forceinline__ void raw(int k, float* f0, float* f1) const {
        const Self& s = *static_cast<const Self*>(this);
        const u32 x = word4(s.q, k);
        signed4(lut16(x & 0x0F0F0F0Fu, Self::T0, Self::T1, Self::T2, Self::T3), f0);
        signed4(lut16((x >> 4) & 0x0F0F0F0Fu, Self::T0, Self::T1, Self::T2, Self::T3), f1);
    }
    __device__ __forceinline__ void coef(float& a0, float& b0, float& a1, float& b1) const {
        const Self& s = *static_cast<const Self*>(this);
        a0 = s.d;
        a1 = s.d;
        b0 = b1 = 0.f;
    }
    // The table values as signed int8 codes, four to a word, and w = d * code (the int16-x MoE products).
    __device__ __forceinline__ void codes(int k, u32& c0, u32& c1) const {
        const u32 x = word4(static_cast<const Self*>(this)->q, k);
        c0 = lut16(x & 0x0F0F0F0Fu, Self::T0, Self::T1, Self::T2, Self::T3);
        c1 = lut16((x >> 4) & 0x0F0F0F0Fu, Self::T0, Self::T1, Self::T2, Self::T3);
    }
    __device__ __forceinline__ void icoef(float& a0, float& b0, float& a1, float& b1) const { coef(a0, b0, a1, b1); }
    __device__ __forceinline__ void get(int k, float* w0, float* w1) const {
        const Self& s = *static_cast<const Self*>(this);
        raw(k, w0, w1);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            w0[i] *= s.d;
            w1[i] *= s.d;
        }
    }
};

// The tables as int8, four to a word: kvalues_mxfp4 {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6,
// -8, -12} and kvalues_iq4nl {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}.
struct FmtMXFP4 : Lut4<FmtMXFP4> {  // e (e8m0), qs[16]: w = 2^(e - 128) * kvalues_mxfp4[q]
    static constexpr u32 T0 = 0x03020100u, T1 = 0x0C080604u, T2 = 0xFDFEFF00u, T3 = 0xF4F8FAFCu;
    static __device__ __forceinline__ int x_base(int u) { return u * 32; }
    float d;
    uint4 q;
    __device__ __forceinline__ void load(const u8* row, int u) {
        const u8* b = row + u * 17;
        const u32 e = __ldg(b);
        d = __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);  // ggml_e8m0_to_fp32_half
        q = ld16u(b + 1);
    }
};

struct FmtIQ4_NL : Lut4<FmtIQ4_NL> {  // d:f16, qs[16]: w = d * kvalues_iq4nl[q]
    static constexpr u32 T0 = 0xBFAD9881u, T1 = 0xF6EADDCFu, T2 = 0x26190D01u, T3 = 0x71594535u;
    static __device__ __forceinline__ int x_base(int u) { return u * 32; }
    float d;
    uint4 q;
    __device__ __forceinline__ void load(const u8* row, int u) {
        const u8* b = row + u * 18;
        d = h2f(ld_u16(b));
        q = ld16u(b + 2);
    }
};

// IQ4_XS (136 bytes, 256 weights): d:f16, scales_h:u16, scales_l[4], qs[128]. Unit u is sub-block
// s = u % 8 of block u / 8: bytes 8 + 16 s.. and the signed 6-bit scale
// ((scales_l[s / 2] >> 4 (s % 2)) & 15 | ((scales_h >> 2 s) & 3) << 4) - 32.
struct FmtIQ4_XS : Lut4<FmtIQ4_XS> {
    static constexpr u32 T0 = 0xBFAD9881u, T1 = 0xF6EADDCFu, T2 = 0x26190D01u, T3 = 0x71594535u;
    static __device__ __forceinline__ int x_base(int u) { return (u >> 3) * 256 + (u & 7) * 32; }
    float d;
    uint4 q;
    __device__ __forceinline__ void load(const u8* row, int u) {
        const u8* b = row + (u >> 3) * 136;
        const int s = u & 7;
        const u32 head = ld_u32_a2(b), scales_l = ld_u32_a2(b + 4);
        const int ls = (int)((scales_l >> (4 * s)) & 15u) | (int)(((head >> 16) >> (2 * s)) & 3u) << 4;
        d = h2f((u16)(head & 0xFFFFu)) * (float)(ls - 32);
        q = ld16u(b + 8 + 16 * s);
    }
};

// NVFP4 (36 bytes, 64 weights): 4 ue4m3 scales (one per 16 weights), then per 16 weights 8 bytes whose
// low nibbles are weights 0..7 and high nibbles 8..15. Unit u is half a block (block u / 2, sub-blocks
// 2h and 2h + 1 as the two runs); w = ue4m3 / 2 * kvalues_mxfp4[q]. ue4m3 ignores the sign bit and
// decodes 0x7F to 0 (ggml_ue4m3_to_fp32): its bits go into a half as for e4m3 (gemv_split.cu), times 128.
struct FmtNVFP4 {
    static constexpr int RUN1 = 16;
    static constexpr bool AFFINE = true;
    static __device__ __forceinline__ int x_base(int u) { return u * 32; }
    static __device__ __forceinline__ float ue4m3_half(u32 b) {
        const u32 m = b & 0x7Fu;
        return b == 0x7Fu ? 0.f : h2f((u16)(m << 7)) * 128.f;
    }
    float d0, d1;
    uint4 q;
    __device__ __forceinline__ void fetch(const u8* row, int u) { load(row, u); }  // quant.cuh's pair: load() whole
    __device__ __forceinline__ void unpack() {}
    __device__ __forceinline__ void load(const u8* row, int u) {
        const u8* b = row + (u >> 1) * 36;
        const int h = u & 1;
        d0 = ue4m3_half(__ldg(b + 2 * h));
        d1 = ue4m3_half(__ldg(b + 2 * h + 1));
        q = ld16u(b + 4 + 16 * h);
    }
    // Weights 4k..4k+3 of a run of 16 are the low (k < 2) or high nibbles of its bytes 4(k % 2)..
    __device__ __forceinline__ void codes(int k, u32& c0, u32& c1) const {
        const int shift = k < 2 ? 0 : 4;
        const u32 a = (word4(q, k & 1) >> shift) & 0x0F0F0F0Fu, c = (word4(q, 2 + (k & 1)) >> shift) & 0x0F0F0F0Fu;
        c0 = lut16(a, FmtMXFP4::T0, FmtMXFP4::T1, FmtMXFP4::T2, FmtMXFP4::T3);
        c1 = lut16(c, FmtMXFP4::T0, FmtMXFP4::T1, FmtMXFP4::T2, FmtMXFP4::T3);
    }
    __device__ __forceinline__ void raw(int k, float* f0, float* f1) const {
        u32 c0, c1;
        codes(k, c0, c1);
        signed4(c0, f0);
        signed4(c1, f1);
    }
    __device__ __forceinline__ void coef(float& a0, float& b0, float& a1, float& b1) const {
        a0 = d0;
        a1 = d1;
        b0 = b1 = 0.f;
    }
    __device__ __forceinline__ void icoef(float& a0, float& b0, float& a1, float& b1) const { coef(a0, b0, a1, b1); }
    __device__ __forceinline__ void get(int k, float* w0, float* w1) const {
        raw(k, w0, w1);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            w0[i] *= d0;
            w1[i] *= d1;
        }
    }
};
