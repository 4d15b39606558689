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

inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline float __int_as_float(int i) { return __uint_as_float((unsigned)i); }
inline float __shfl_xor_sync(unsigned, float v, int) { return v; }

inline float h2f(unsigned short h) {
    const unsigned sign = h >> 15, exp = (h >> 10) & 31u, mant = h & 1023u;
    float v;
    if (exp == 0) v = std::ldexp((float)mant, -24);
    else if (exp == 31) v = mant ? NAN : INFINITY;
    else v = std::ldexp((float)(mant | 1024u), (int)exp - 25);
    return sign ? -v : v;
}
inline unsigned short f2h(float) { return 0; }  // not used by the decoders
