// Whole rows of a GGUF tensor to float32 or float16.
//
// Two users: the embedding gather (selected rows, float32) and the prefill path, which
// expands a slice of rows to float16 for the tensor-core matrix product. One thread
// decodes one 32-weight unit with the same decoders the GEMV kernels use.
#include "quant.cuh"

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

// Output row i is source row ids[i] (clamped into the tensor, so a bad id cannot read
// out of bounds), or row_offset + i when ids is null.
template <class Fmt, class Out>
__device__ __forceinline__ void dequant_body(const u8* __restrict__ w, i64 row_bytes, int n_cols,
                                             const int* __restrict__ ids, int n_out_rows, int row_offset,
                                             int n_src_rows, typename Out::T* __restrict__ y) {
    const int units = n_cols >> 5;
    const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (i64)n_out_rows * units) return;
    const int i = (int)(idx / units), u = (int)(idx % units);
    int src = ids != nullptr ? ids[i] : row_offset + i;
    src = min(max(src, 0), n_src_rows - 1);
    Fmt f;
    f.load(w + (i64)src * row_bytes, u);
    typename Out::T* out = y + (i64)i * n_cols + Fmt::x_base(u);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        float w0[4], w1[4];
        f.get(k, w0, w1);
        Out::store4(out + 4 * k, w0);
        Out::store4(out + Fmt::RUN1 + 4 * k, w1);
    }
}

#define DEQUANT_KERNEL(SUFFIX, FMT, OUTNAME, OUT)                                                          \
    extern "C" __global__ void __launch_bounds__(256) dequant_##SUFFIX##_##OUTNAME(                      \
        const u8* __restrict__ w, i64 row_bytes, int n_cols, const int* __restrict__ ids, int n_out_rows, \
        int row_offset, int n_src_rows, OUT::T* __restrict__ y) {                                         \
        dequant_body<FMT, OUT>(w, row_bytes, n_cols, ids, n_out_rows, row_offset, n_src_rows, y);         \
    }

#define DEQUANT_FORMAT(SUFFIX, FMT)             \
    DEQUANT_KERNEL(SUFFIX, FMT, f32, OutF32)    \
    DEQUANT_KERNEL(SUFFIX, FMT, f16, OutF16)

#if defined(PADDOCK_ALL_VARIANTS)
PADDOCK_FORMATS(DEQUANT_FORMAT)
#else
DEQUANT_FORMAT(PADDOCK_FORMAT, PADDOCK_FORMAT_STRUCT)
#endif
