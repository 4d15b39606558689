// Whole rows of a GGUF tensor to float32 or float16.
//
// Two users: the embedding gather (selected rows, float32) and the prefill path, which
// expands a slice of rows to float16 for the tensor-core matrix product. One thread
// decodes one 32-weight unit with the same decoders the GEMV kernels use.
#include "quant.cuh"
#include "store_out.cuh"

#define DEQUANT_THREADS 256

// Output row i is source row ids[i] (clamped into the tensor, so a bad id cannot read
// out of bounds), or row_offset + i when ids is null.
//
// Block b decodes units b*256 .. b*256+255 of the output, counted row-major. Their
// weights fill one contiguous stretch of the output (a row is a whole number of units
// and a k-quant block's 8 units cover its 256 columns), so they are decoded into shared
// memory first and then written with 16-byte stores that cover the stretch in order:
// each thread's own unit is 64 or 128 scattered bytes, which would cost the L2 several
// partial-sector writes per store.
template <class Fmt, class Out>
__device__ __forceinline__ void dequant_body(const u8* __restrict__ w, i64 row_bytes, int n_cols,
                                             const int* __restrict__ ids, int n_out_rows, int row_offset,
                                             int n_src_rows, typename Out::T* __restrict__ y) {
    typedef typename Out::T T;
    __shared__ __align__(16) T tile[DEQUANT_THREADS * 32];
    const int units = n_cols >> 5;
    const i64 total = (i64)n_out_rows * units;
    const i64 first = (i64)blockIdx.x * DEQUANT_THREADS;
    const i64 idx = first + threadIdx.x;
    if (idx < total) {
        const int i = (int)(idx / units), u = (int)(idx % units);
        int src = ids != nullptr ? ids[i] : row_offset + i;
        src = min(max(src, 0), n_src_rows - 1);
        Fmt f;
        f.load(w + (i64)src * row_bytes, u);
        // Offset of this unit's first weight inside the block's stretch of the output.
        const int local = (int)((i64)i * n_cols + Fmt::x_base(u) - first * 32);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            float w0[4], w1[4];
            f.get(k, w0, w1);
            Out::store4(tile + local + 4 * k, w0);
            Out::store4(tile + local + Fmt::RUN1 + 4 * k, w1);
        }
    }
    __syncthreads();
    const i64 n_valid = (total - first < DEQUANT_THREADS ? total - first : DEQUANT_THREADS) * 32;
    constexpr int PER16 = 16 / sizeof(T);  // elements per 16-byte store
    T* out = y + first * 32;
    for (int e = threadIdx.x * PER16; e < n_valid; e += DEQUANT_THREADS * PER16)
        *reinterpret_cast<uint4*>(out + e) = *reinterpret_cast<const uint4*>(tile + e);
}

#define DEQUANT_KERNEL(SUFFIX, FMT, OUTNAME, OUT)                                                          \
    extern "C" __global__ void __launch_bounds__(DEQUANT_THREADS) dequant_##SUFFIX##_##OUTNAME(                      \
        const u8* __restrict__ w, i64 row_bytes, int n_cols, const int* __restrict__ ids, int n_out_rows, \
        int row_offset, int n_src_rows, OUT::T* __restrict__ y) {                                         \
        after_previous_grid();                                                                            \
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
