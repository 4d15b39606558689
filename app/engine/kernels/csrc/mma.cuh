// Tensor-core and asynchronous-copy primitives (sm_80+): warp-wide mma.sync, ldmatrix and cp.async.
//
// Fragment layouts of mma.sync.m16n8k16 with f16 inputs and f32 accumulators, for lane
// `l`, g = l / 4, t = l % 4 (PTX ISA, "Matrix Fragments for mma.m16n8k16"):
//   A (16 x 16, row-major): a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..], a[2] = A[g][2t+8..], a[3] = A[g+8][2t+8..]
//   B (16 x 8, k x n):      b[0] = B[2t..2t+1][g],  b[1] = B[2t+8..2t+9][g]
//   C (16 x 8):             c[0..1] = C[g][2t..2t+1], c[2..3] = C[g+8][2t..2t+1]
// Two C tiles side by side (n = 0..15) are exactly one A fragment of the next product once
// converted to f16, which is how attention feeds P = softmax(S) into P @ V without shared memory.
//
// The SIMT emulator (tests/engine/cuda/host/simt_emulator.h) brings host versions of these
// warp-collective operations under PADDOCK_HOST_SHIM.
#pragma once
#include "common.cuh"

// A kernel's dynamic shared memory (the emulator hands out a per-block host buffer instead).
#ifndef PADDOCK_HOST_SHIM
#define PADDOCK_DYNAMIC_SHARED(T, name) extern __shared__ __align__(16) T name[]
#else
#define PADDOCK_DYNAMIC_SHARED(T, name) T* name = emu_dynamic_shared<T>()
#endif

#ifndef PADDOCK_HOST_SHIM
// A generic pointer into shared memory as the 32-bit shared-window address PTX wants.
__device__ __forceinline__ u32 shared_address(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// D = A @ B + D for one warp: 16 x 8 f32 tile, 16 x 16 f16 A, 16 x 8 f16 B.
__device__ __forceinline__ void mma_16816(float* d, const u32* a, const u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Four 8 x 8 f16 matrices from shared memory: lanes 8i..8i+7 give the addresses of matrix i's rows
// (16 bytes each, 16-byte aligned); r[i] is lane's word of matrix i, row l / 4, columns 2(l % 4)..+1.
__device__ __forceinline__ void ldsm_x4(u32* r, const u16* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row)));
}

// Four transposed 8 x 8 f16 matrices from shared memory: lanes 8i..8i+7 give the addresses of
// matrix i's rows (16 bytes each, 16-byte aligned); r[i] is lane's B-fragment word of matrix i.
__device__ __forceinline__ void ldsm_x4_trans(u32* r, const u16* row) {
    const u32 addr = shared_address(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// 16 bytes global -> shared without passing through registers; `valid` false fills zeros.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    const u32 addr = shared_address(dst);
    const int bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(addr), "l"(src), "r"(bytes));
}

// The same through L1 (.ca): for data a block reads again soon (gemv_q4r's scale pairs: four chunks each).
__device__ __forceinline__ void cp_async16_ca(void* dst, const void* src, bool valid) {
    const u32 addr = shared_address(dst);
    const int bytes = valid ? 16 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" ::"r"(addr), "l"(src), "r"(bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }

// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

// Two floats as one f16x2 word (lo in the low half), rounded to nearest: one instruction.
__device__ __forceinline__ u32 pack_h2_rn(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
#endif

// Float16 pairs, a - b and a * b + c, each rounded once (PTX: NVRTC has no cuda_fp16.h here; the emulator computes
// each half in double and rounds it once).
#ifndef PADDOCK_HOST_SHIM
__device__ __forceinline__ u32 h2_sub(u32 a, u32 b) {
    u32 r;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ u32 h2_fma(u32 a, u32 b, u32 c) {
    u32 r;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
#else
inline u32 h2_op(u32 a, u32 b, u32 c, bool fma) {  // each half in double (exact here), rounded once to float16
    u32 r = 0;
    for (int h = 0; h < 2; ++h) {
        const double x = h2f((u16)(a >> 16 * h)), y = h2f((u16)(b >> 16 * h)), z = h2f((u16)(c >> 16 * h));
        r |= (u32)f2h((float)(fma ? x * y + z : x - y)) << 16 * h;
    }
    return r;
}
inline u32 h2_sub(u32 a, u32 b) { return h2_op(a, b, 0, false); }
inline u32 h2_fma(u32 a, u32 b, u32 c) { return h2_op(a, b, c, true); }
#endif

// 1024.0 twice in float16: an integer code u < 1024 in a half's low mantissa bits (exponent byte 0x64) is 1024 + u.
constexpr u32 H2_1024 = 0x64006400u;

// Two byte codes of a word (bytes i and i + 1: SELECTOR 0x4140 or 0x4342) as float16 a u + b: 1024 + u by a byte
// permute with `high`'s 0x64 bytes, minus 1024 exactly, then one fma with the pairs (a, a) and (b, b).
template <u32 SELECTOR>
__device__ __forceinline__ u32 code_pair(u32 codes, u32 high, u32 a2, u32 b2) {
    return h2_fma(h2_sub(__byte_perm(codes, high, SELECTOR), H2_1024), a2, b2);
}

// A warp's accumulator tiles, zeroed (mma_16816's C fragments, [A][B] of them).
template <int A, int B>
__device__ __forceinline__ void zero_tiles(float (&c)[A][B][4]) {
#pragma unroll
    for (int a = 0; a < A; ++a)
#pragma unroll
        for (int b = 0; b < B; ++b) c[a][b][0] = c[a][b][1] = c[a][b][2] = c[a][b][3] = 0.f;
}
