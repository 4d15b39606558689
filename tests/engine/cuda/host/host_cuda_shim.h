// Just enough of CUDA's device vocabulary to compile app/engine/kernels/quant.cuh as host
// C++, so its block decoders can be checked against the numpy oracle on a machine with
// no GPU. Force-included (-include) with -DPADDOCK_HOST_SHIM.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#define __device__
#define __forceinline__ inline

struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
struct float4 { float x, y, z, w; };
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

template <class T>
inline T __ldg(const T* p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
}

inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned sh) {
    return (unsigned)(((((uint64_t)hi) << 32) | lo) >> (sh & 31));
}

// Byte i of the result is byte (s >> 4i) & 7 of the pair {y:x} (no sign-replicate mode).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const uint64_t pair = ((uint64_t)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)((pair >> (8 * ((s >> (4 * i)) & 7))) & 0xffu) << (8 * i);
    return r;
}

inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline float __int_as_float(int i) { return __uint_as_float((unsigned)i); }
inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float __fadd_rn(float a, float b) { return a + b; }  // the host builds never contract (-ffp-contract=off)
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __shfl_xor_sync(unsigned, float v, int) { return v; }

inline float h2f(unsigned short h) {
    const unsigned sign = h >> 15, exp = (h >> 10) & 31u, mant = h & 1023u;
    float v;
    if (exp == 0) v = std::ldexp((float)mant, -24);
    else if (exp == 31) v = mant ? NAN : INFINITY;
    else v = std::ldexp((float)(mant | 1024u), (int)exp - 25);
    return sign ? -v : v;
}
// float -> half, round to nearest even (as cvt.rn.f16.f32).
inline unsigned short f2h(float f) {
    unsigned x;
    std::memcpy(&x, &f, 4);
    const unsigned sign = (x >> 16) & 0x8000u, absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) return (unsigned short)(sign | (absx > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (absx >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);  // rounds past 65504
    if (absx < 0x38800000u) {  // below 2^-14: a subnormal half, in units of 2^-24
        float a;
        std::memcpy(&a, &absx, 4);
        return (unsigned short)(sign | (unsigned)std::nearbyint(a * 16777216.0f));
    }
    const unsigned mant = absx & 0x7fffffu, exp = (absx >> 23) - 112u;
    unsigned h = (exp << 10) | (mant >> 13);
    const unsigned rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h += 1;
    return (unsigned short)(sign | h);
}

// For gemv_int.cuh: integer codes, their dot products and the float2 (scale, sum) pairs.
#define __host__
struct float2 { float x, y; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline int __float2int_rn(float v) { return (int)std::nearbyint(v); }  // ties to even, as cvt.rni
// Two int16 of a times the int8 bytes 0, 1 (lo) or 2, 3 (hi) of b, plus c.
inline int dp2a_emulated(int a, int b, int c, int byte0) {
    for (int i = 0; i < 2; ++i) c += (int)(short)(a >> (16 * i)) * (int)(signed char)(b >> (8 * (byte0 + i)));
    return c;
}
inline int __dp2a_lo(int a, int b, int c) { return dp2a_emulated(a, b, c, 0); }
inline int __dp2a_hi(int a, int b, int c) { return dp2a_emulated(a, b, c, 2); }
