// FP8 (OCP e4m3 "fn") KV cache codec: the device side of app/engine/backend/fp8_kv.py, bit for bit.
//
// Layout (the numpy backend's Fp8KvCache): K and V each `data [num_blocks, block_size, n_kv, D]`
// e4m3 bytes and `scale [num_blocks, n_kv]` float32, a power of two per (block, KV head); stored
// byte = e4m3(x / scale), read value = decode(byte) * scale.
//
// Plain integer and float code, no cuda_fp8.h: NVRTC compiles it without the toolkit's headers and
// the SIMT-emulator tests compile it as host C++ (tests/engine/cuda/host/fp8_main.cpp checks it
// against the numpy encoder over every code and random floats).
#pragma once
#include "common.cuh"

#define E4M3_MAX 448.f

// float -> e4m3fn: round to nearest, ties to even; |x| >= 448 (and infinities) saturate to +-448;
// NaN -> 0x7f with x's sign.
__device__ __forceinline__ u8 e4m3_encode(float x) {
    const u32 bits = __float_as_uint(x), a = bits & 0x7fffffffu;
    const u32 sign = (bits >> 24) & 0x80u;
    if (a > 0x7f800000u) return (u8)(sign | 0x7fu);
    if (a >= 0x43e00000u) return (u8)(sign | 0x7eu);  // 448 = 1.75 * 2^8 and beyond
    const u32 e = a >> 23;
    u32 code;
    if (e < 121) {  // below 2^-6, e4m3's subnormals: multiples of 2^-9 (8 of them is the code of 2^-6)
        code = (u32)rintf(__uint_as_float(a) * 512.f);  // exact product; rintf rounds ties to even
    } else {  // keep 3 of the 23 mantissa bits; a carry out of them moves into the exponent field
        const u32 m = a & 0x7fffffu, rest = m & 0xfffffu;
        code = ((e - 120u) << 3) | (m >> 20);  // exponent bias 7: e - 127 + 7
        if (rest > 0x80000u || (rest == 0x80000u && (code & 1u))) ++code;
    }
    return (u8)(sign | code);
}

// The e4m3 code as a float16 of its value times 2^-8, exactly (bias 7 against 15, same mantissa
// alignment: subnormals line up too), for every code but the NaNs 0x7f / 0xff. Readers take these
// into their float16 paths and fold the 2^8 into the block's scale (E4M3_HALF_UNSCALE).
__device__ __forceinline__ u16 e4m3_to_half_2m8(u32 code) { return (u16)(((code & 0x80u) << 8) | ((code & 0x7fu) << 7)); }

#define E4M3_HALF_UNSCALE 256.f

// Four codes (a little-endian word) as two words of float16 pairs (e4m3_to_half_2m8 each).
__device__ __forceinline__ void e4m3x4_to_half2m8(u32 w, u32& lo, u32& hi) {
    const u32 a = (w & 0xffu) | ((w & 0xff00u) << 8), b = ((w >> 16) & 0xffu) | ((w >> 8) & 0xff0000u);
    lo = ((a & 0x00800080u) << 8) | ((a & 0x007f007fu) << 7);
    hi = ((b & 0x00800080u) << 8) | ((b & 0x007f007fu) << 7);
}

// Eight codes (16-byte halves unit's worth) as the 16 bytes of float16 the float16 cache would hold,
// all times 2^-8.
__device__ __forceinline__ uint4 e4m3x8_to_half2m8(uint2 c) {
    uint4 h;
    e4m3x4_to_half2m8(c.x, h.x, h.y);
    e4m3x4_to_half2m8(c.y, h.z, h.w);
    return h;
}

__device__ __forceinline__ float e4m3_decode(u32 code) {
    if ((code & 0x7fu) == 0x7fu) return __int_as_float(0x7fc00000);
    return h2f(e4m3_to_half_2m8(code)) * E4M3_HALF_UNSCALE;
}

// The smallest power of two s with amax / s <= 448 (fp8_kv.pow2_scale), 0 for amax 0: an empty
// block. amax = (1 + M) 2^e fits under 1.75 * 2^(8 + k) for k = e - 8 when M <= 0.75, else e - 7.
__device__ __forceinline__ float e4m3_block_scale(float amax) {
    if (!(amax > 0.f)) return 0.f;
    u32 b = __float_as_uint(amax);
    int shift = 0;
    if ((b >> 23) == 0) {  // a subnormal float32: normalise it exactly first
        b = __float_as_uint(amax * 16777216.f);
        shift = 24;
    }
    const int e = (int)(b >> 23) - 127;
    const int k = ((b & 0x7fffffu) <= 0x600000u ? e - 8 : e - 7) - shift;
    if (k < -149) return 0.f;
    return k >= -126 ? __uint_as_float((u32)(k + 127) << 23) : __uint_as_float(1u << (k + 149));
}
