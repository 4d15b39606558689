// Output element types of the dequantize kernels (dequant.cu, gemv_split.cu): four values at a time.
#pragma once
#include "common.cuh"

struct OutF32 {
    typedef float T;
    static __device__ __forceinline__ void store4(float* y, const float* v) {
        *reinterpret_cast<float4*>(y) = make_float4(v[0], v[1], v[2], v[3]);
    }
};

struct OutF16 {
    typedef u16 T;
    static __device__ __forceinline__ void store4(u16* y, const float* v) {
        *reinterpret_cast<uint2*>(y) = make_uint2(pack_h2(v[0], v[1]), pack_h2(v[2], v[3]));
    }
};
