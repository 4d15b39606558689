// Shared device helpers for every Paddock kernel.
//
// No system headers on purpose: NVRTC compiles this without an include path to the CUDA
// toolkit (users have only the driver and CuPy's wheels), so half/bfloat16 conversions are
// written as PTX and integer types are declared here.
#pragma once

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

#define PADDOCK_INF __int_as_float(0x7f800000)

// -- float formats --------------------------------------------------------------------

// PADDOCK_HOST_SHIM: the decoders are also compiled as plain C++ by a CPU-only test
// (tests/engine/cuda/host/), which brings its own versions of these two.
#ifndef PADDOCK_HOST_SHIM
__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#endif

// bfloat16 is the upper half of a float32: widening is a shift.
__device__ __forceinline__ float bf2f(u16 b) { return __uint_as_float(((u32)b) << 16); }

// Low and high halves of a 32-bit word holding two f16 values.
__device__ __forceinline__ float h2f_lo(u32 w) { return h2f((u16)(w & 0xffffu)); }
__device__ __forceinline__ float h2f_hi(u32 w) { return h2f((u16)(w >> 16)); }

__device__ __forceinline__ u32 pack_h2(float lo, float hi) { return (u32)f2h(lo) | ((u32)f2h(hi) << 16); }

// An output element as the caller's buffer holds it: float32, or float16 rounded to nearest (what a cast
// gives: for a product that reads float16, which would otherwise cast the output in a kernel of its own).
__device__ __forceinline__ void store_as(float* out, i64 i, float v) { out[i] = v; }
__device__ __forceinline__ void store_as(u16* out, i64 i, float v) { out[i] = f2h(v); }

// -- loads ------------------------------------------------------------------------------

__device__ __forceinline__ u16 ld_u16(const u8* p) { return __ldg(reinterpret_cast<const unsigned short*>(p)); }

// Two 16-bit loads: GGUF blocks of 18, 22, 34 and 210 bytes leave 32-bit fields 2-aligned.
__device__ __forceinline__ u32 ld_u32_a2(const u8* p) { return (u32)ld_u16(p) | ((u32)ld_u16(p + 2) << 16); }

__device__ __forceinline__ uint4 ld16(const u8* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

// 16 bytes from a 2-byte-aligned address, built from the two aligned 16-byte words that
// cover it. Neighbouring lanes read overlapping words, so HBM traffic stays one pass
// (the second word is an L1 hit); buffers are padded by 16 bytes so the second load of
// the last unit stays inside the allocation.
__device__ __forceinline__ uint4 ld16u(const u8* p) {
    const unsigned long long a = reinterpret_cast<unsigned long long>(p);
    const uint4* base = reinterpret_cast<const uint4*>(a & ~15ull);
    const u32 m = (u32)(a & 15);
    const uint4 lo = __ldg(base);
    const uint4 hi = __ldg(base + 1);
    u32 w0 = lo.x, w1 = lo.y, w2 = lo.z, w3 = lo.w, w4 = hi.x, w5 = hi.y, w6 = hi.z, w7 = hi.w;
    if (m & 8) {  // skip two words; selects, never a run-time register index
        w0 = w2; w1 = w3; w2 = w4; w3 = w5; w4 = w6; w5 = w7;
    }
    if (m & 4) {
        w0 = w1; w1 = w2; w2 = w3; w3 = w4; w4 = w5;
    }
    const u32 sh = (m & 3) * 8;
    uint4 r;
    r.x = __funnelshift_r(w0, w1, sh);
    r.y = __funnelshift_r(w1, w2, sh);
    r.z = __funnelshift_r(w2, w3, sh);
    r.w = __funnelshift_r(w3, w4, sh);
    return r;
}

// Byte `i` (compile-time after unrolling) of a 32-bit word, as unsigned and as signed.
__device__ __forceinline__ u32 ubyte(u32 w, int i) { return (w >> (8 * i)) & 0xffu; }
__device__ __forceinline__ int sbyte(u32 w, int i) { return ((int)(w << (24 - 8 * i))) >> 24; }

// -- programmatic dependent launch (pdl.py) ------------------------------------------------

// In a decode graph (sm_90+) a kernel may start while its predecessor still runs. Before
// wait_previous_grid() it must touch nothing another kernel writes or reads: only its weights,
// and only as L2 prefetches. Right after the wait it lets its own successor launch, so at
// most two kernels overlap. Launched normally, or below sm_90, both are no-ops.
__device__ __forceinline__ void wait_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void launch_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Both, for kernels with nothing to prefetch.
__device__ __forceinline__ void after_previous_grid() {
    wait_previous_grid();
    launch_next_grid();
}

// -- thread-block clusters (sm_90+) --------------------------------------------------------

// A kernel declared with __cluster_dims__ runs in clusters of blocks that are scheduled together
// on one GPC and may read each other's shared memory (distributed shared memory). PTX rather than
// cooperative_groups: NVRTC has no CUDA headers here. Only for code compiled for sm_90+.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// barrier.cluster: arrive has release semantics and wait acquire (the PTX defaults), so what any
// thread of the cluster wrote before its arrive is visible after the wait. Every non-exited thread
// of the cluster takes part; a block whose shared memory another block may still read must not exit
// before the wait that follows those reads.
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait;" ::: "memory"); }
__device__ __forceinline__ void cluster_sync() {
    cluster_arrive();
    cluster_wait();
}

// The address of the same shared variable as `p` in block `rank` of this cluster (a generic
// pointer: plain loads read the other block's shared memory).
template <class T>
__device__ __forceinline__ const T* cluster_map_shared(const T* p, int rank) {
    unsigned long long q;
    asm("mapa.u64 %0, %1, %2;" : "=l"(q) : "l"(p), "r"(rank));
    return reinterpret_cast<const T*>(q);
}
#endif

// How much a kernel prefetches before its wait: enough to keep HBM busy across the gap
// between two kernels (~2 us at ~4 TB/s is ~8 MB over a grid's warps), not its whole weight.
// Prefetching whole matrices (40 MB of an 8B model's down projection) while the previous
// kernel streams its own through the 50 MB L2 evicted both and made the step slower.
#ifndef PDL_PREFETCH_WARP_BYTES
#define PDL_PREFETCH_WARP_BYTES 2048
#endif
#ifndef PDL_PREFETCH_BLOCK_BYTES
#define PDL_PREFETCH_BLOCK_BYTES 8192
#endif
// Only small weights are prefetched: a big one's kernel is bandwidth-bound anyway, and its
// prefetches compete with the previous kernel's stream: the 0.6B step gains from them, the 8B
// step loses with prefetches of every weight (docs/tuning-log.md).
#ifndef PDL_PREFETCH_MAX_WEIGHT
#define PDL_PREFETCH_MAX_WEIGHT (8ll << 20)
#endif

// `bytes` from `p` pulled into L2 by a warp or a block, thread t from line t on (128-byte lines).
// Device code only: the host builds of these headers (tests/engine/cuda/host) skip it.
__device__ __forceinline__ void prefetch_l2(const u8* p, i64 bytes, int id, int threads) {
#if defined(__CUDA_ARCH__)
    for (i64 off = (i64)id * 128; off < bytes; off += (i64)threads * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off));
#endif
}

__device__ __forceinline__ void prefetch_l2_warp(const u8* p, i64 bytes) {
#if defined(__CUDA_ARCH__)
    prefetch_l2(p, bytes, threadIdx.x & 31, 32);
#endif
}

__device__ __forceinline__ void prefetch_l2_block(const u8* p, i64 bytes) {
#if defined(__CUDA_ARCH__)
    prefetch_l2(p, bytes, threadIdx.x, blockDim.x);
#endif
}

// -- reductions ---------------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// -- gated activations ----------------------------------------------------------------------

// act(g) * u, in float32 as the numpy backend writes them (accurate expf/tanhf: a
// parity test compares them with numpy; these kernels are bound by memory, not arithmetic).
template <int ACT>
__device__ __forceinline__ float gated_act(float g, float u) {
    if (ACT == 0) return g / (1.f + expf(-g)) * u;  // silu
    const float inner = 0.7978845608028654f * (g + 0.044715f * g * g * g);  // gelu_tanh, sqrt(2/pi)
    return 0.5f * g * (1.f + tanhf(inner)) * u;
}
