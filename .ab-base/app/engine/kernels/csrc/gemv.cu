// Quantized matrix-vector products for decode: y[t, r] = sum_c W[r, c] * x[t, c] (+ bias[r]).
//
// One weight per launch; the bodies live in gemv.cuh (shared with gemv_fused.cu). Rows
// per block R by token bucket T: more rows reuse x more, more tokens need more
// registers; T=1 comes in two R so the benchmark can pick, and in R=1 for weights of so few
// rows that R=4 or 8 would leave most multiprocessors idle (Gated DeltaNet's [2 x 48, 5120]
// F32 beta/alpha took 12.8 us a launch at 6 blocks: 0.08 TB/s).
#include "gemv.cuh"

#define GEMV_KERNEL(SUFFIX, FMT, T, R)                                                                    \
    extern "C" __global__ void __launch_bounds__(256) gemv_##SUFFIX##_t##T##_r##R(                       \
        const u8* __restrict__ w, i64 row_bytes, int n_rows, int n_cols, const float* __restrict__ x,    \
        int n_tok, float* __restrict__ y, const float* __restrict__ bias) {                              \
        gemv_rows<FMT, T, R>(w, row_bytes, n_rows, n_cols, x, n_tok, y, n_rows, bias, blockIdx.x);        \
    }

#define GEMV_FORMAT(SUFFIX, FMT)     \
    GEMV_KERNEL(SUFFIX, FMT, 1, 8)   \
    GEMV_KERNEL(SUFFIX, FMT, 1, 4)   \
    GEMV_KERNEL(SUFFIX, FMT, 1, 1)   \
    GEMV_KERNEL(SUFFIX, FMT, 2, 4)   \
    GEMV_KERNEL(SUFFIX, FMT, 4, 2)   \
    GEMV_KERNEL(SUFFIX, FMT, 8, 2)

// The Python wrapper compiles one format per module (-DPADDOCK_FORMAT=q4_k
// -DPADDOCK_FORMAT_STRUCT=FmtQ4_K); the compile check defines PADDOCK_ALL_VARIANTS to
// build every format at once.
#if defined(PADDOCK_ALL_VARIANTS)
PADDOCK_FORMATS(GEMV_FORMAT)
#else
GEMV_FORMAT(PADDOCK_FORMAT, PADDOCK_FORMAT_STRUCT)
#endif
