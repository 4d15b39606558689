// A small SIMT emulator: runs Paddock's CUDA kernels as host C++ so that their indexing,
// barriers and warp shuffles are tested on machines without a GPU (CI).
//
// Every CUDA thread of a block is a fiber (its own stack, switched on one OS thread; see
// switch_context); blocks run one after another. A fiber runs until it reaches a barrier, then the next
// one runs, in thread order: __syncthreads is a barrier over the block, __shfl_xor_sync exchanges
// values through a per-warp buffer between two warp barriers, and __shared__ variables become
// function statics (shared by the block's threads; blocks never overlap). Fibers rather than
// std::threads: a block of 128 threads and its thousands of barrier rounds cost microseconds of
// switching instead of thread starts and futex wake-ups, and the schedule is the same every run.
// A thread that reads what another writes without a barrier between them reads it unwritten (the
// writer has not run yet), and a kernel whose warps diverge around a shuffle or barrier ends in a
// reported deadlock (every unfinished thread waiting), as it would misbehave on the GPU.
// Compile with -std=c++20 -DPADDOCK_HOST_SHIM -include simt_emulator.h.
#pragma once
#include <sys/mman.h>
#include <ucontext.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <vector>

#include "host_cuda_shim.h"

#define __global__
#define __shared__ static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__

using std::max;
using std::min;

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

// The running fiber's coordinates: set by the scheduler each time it switches to a fiber.
inline dim3 blockIdx, blockDim, gridDim, threadIdx;
inline int t_warp = 0, t_lane = 0;

namespace emu {

#if defined(__x86_64__)
// glibc's swapcontext saves and restores the signal mask with a system call at every switch, and
// the barriers make millions of switches: 6.9 million rt_sigprocmask calls in one prefill case, about
// half of its time. No fiber touches signals, so on x86-64 a switch keeps only what the System V ABI
// says a call preserves: the callee-saved registers, pushed on the fiber's own stack, and the stack
// pointer (MXCSR and the x87 control word are left alone: no kernel changes a rounding mode).
extern "C" void emu_switch(void** save_sp, void* load_sp);
asm(R"(
    .text
    .globl emu_switch
    .type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch, .-emu_switch
)");

struct Context {
    void* sp = nullptr;
};
inline void switch_context(Context& from, Context& to) { emu_switch(&from.sp, to.sp); }
// Make `to` start `entry` on `stack`: a frame as emu_switch leaves one, six zeroed registers and a
// return address, placed so that `entry` begins with the stack aligned as after a call.
inline void start_context(Context& to, char* stack, size_t size, void (*entry)()) {
    auto top = reinterpret_cast<uintptr_t>(stack + size) & ~uintptr_t{15};
    void** frame = reinterpret_cast<void**>(top) - 8;
    for (int i = 0; i < 6; ++i) frame[i] = nullptr;
    frame[6] = reinterpret_cast<void*>(entry);
    frame[7] = nullptr;
    to.sp = frame;
}
#else
struct Context {
    ucontext_t uc;
};
inline void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
inline void start_context(Context& to, char* stack, size_t size, void (*entry)()) {
    getcontext(&to.uc);
    to.uc.uc_stack.ss_sp = stack;
    to.uc.uc_stack.ss_size = size;
    to.uc.uc_link = nullptr;  // entry never returns: it switches back to the scheduler
    makecontext(&to.uc, entry, 0);
}
#endif

struct Fiber {
    Context context;
    char* stack = nullptr;  // STACK bytes, a guard page below
    bool runnable = false, done = false;
};

constexpr size_t GUARD = 1 << 12, STACK = 1 << 20;  // as much stack as a kernel's locals need
inline std::vector<Fiber> fibers;                  // grows to the largest block; stacks reused
inline Context scheduler;
inline int current = -1;
inline std::function<void()> kernel;

inline void fiber_main() {
    kernel();
    fibers[current].done = true;
    fibers[current].runnable = false;
    switch_context(fibers[current].context, scheduler);  // never resumed: the next block starts anew
    std::abort();
}

// Suspends the running fiber until the scheduler picks it again (after a barrier releases it).
inline void suspend() {
    fibers[current].runnable = false;
    switch_context(fibers[current].context, scheduler);
}

}  // namespace emu

struct Barrier {
    explicit Barrier(int count) : expected(count) {}
    void arrive_and_wait() {
        if (++arrived == expected) {  // the last to arrive releases the others and runs on
            arrived = 0;
            for (int tid : waiting) emu::fibers[tid].runnable = true;
            waiting.clear();
            return;
        }
        waiting.push_back(emu::current);
        emu::suspend();
    }
    int expected, arrived = 0;
    std::vector<int> waiting;
};

struct BlockSync {
    std::unique_ptr<Barrier> block;
    std::vector<std::unique_ptr<Barrier>> warps;
    std::vector<std::array<unsigned long long, 32>> exchange;
    std::vector<std::array<unsigned, 32 * 10>> fragments;  // mma / ldmatrix operands of each warp's lanes
};

inline BlockSync* g_sync = nullptr;

inline void __syncthreads() { g_sync->block->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { g_sync->warps[t_warp]->arrive_and_wait(); }

template <class T>
inline T shfl_xor_emulated(T v, int offset) {
    auto& slots = g_sync->exchange[t_warp];
    std::memcpy(&slots[t_lane], &v, sizeof(T));
    __syncwarp();
    T r;
    std::memcpy(&r, &slots[t_lane ^ offset], sizeof(T));
    __syncwarp();
    return r;
}
#define __shfl_xor_sync(mask, v, offset) shfl_xor_emulated((v), (offset))

namespace emu {

inline void ensure_fibers(int n) {
    while ((int)fibers.size() < n) {
        void* mem = mmap(nullptr, GUARD + STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (mem == MAP_FAILED || mprotect(mem, GUARD, PROT_NONE) != 0) {
            std::perror("emulator: a fiber stack");
            std::abort();
        }
        fibers.emplace_back().stack = static_cast<char*>(mem) + GUARD;
    }
}

// Runs one block's `n` threads to their ends, always resuming the lowest-numbered runnable thread
// after the one that last ran (so each barrier round runs the threads in order).
inline void run_block(int n) {
    for (int tid = 0; tid < n; ++tid) {
        Fiber& f = fibers[tid];
        start_context(f.context, f.stack, STACK, fiber_main);
        f.runnable = true;
        f.done = false;
    }
    for (int left = n, next = 0; left > 0;) {
        int pick = -1;
        for (int k = 0; k < n && pick < 0; ++k)
            if (fibers[(next + k) % n].runnable) pick = (next + k) % n;
        if (pick < 0) {
            std::fprintf(stderr, "emulator: deadlock in block (%u,%u,%u): %d threads wait at barriers no other thread reaches\n",
                         blockIdx.x, blockIdx.y, blockIdx.z, left);
            std::abort();
        }
        current = pick;
        threadIdx = {pick % blockDim.x, (pick / blockDim.x) % blockDim.y, pick / (blockDim.x * blockDim.y)};
        t_warp = pick / 32;
        t_lane = pick % 32;
        switch_context(scheduler, fibers[pick].context);
        if (fibers[pick].done) --left;
        next = (pick + 1) % n;
    }
    current = -1;
}

}  // namespace emu

// Run `body` (a kernel call with its arguments bound) over the grid.
template <class F>
inline void launch(dim3 grid, dim3 block, F body) {
    gridDim = grid;
    blockDim = block;
    const int n = (int)(block.x * block.y * block.z);
    emu::ensure_fibers(n);
    emu::kernel = body;
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                blockIdx = {bx, by, bz};
                BlockSync sync;
                sync.block = std::make_unique<Barrier>(n);
                for (int w = 0; w * 32 < n; ++w) {
                    sync.warps.push_back(std::make_unique<Barrier>(std::min(32, n - 32 * w)));
                    sync.exchange.emplace_back();
                    sync.fragments.emplace_back();
                }
                g_sync = &sync;
                emu::run_block(n);
            }
    emu::kernel = nullptr;
}

// Device-wide memory operations: blocks run one after another here, so a fence has nothing
// to order and an atomic only has to be atomic among one block's threads.
#include <atomic>
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
template <class T>
inline T atomicAdd(T* p, T v) {
    return std::atomic_ref<T>(*p).fetch_add(v);
}
template <class T>
inline T __ldcg(const T* p) {
    return *p;
}

// -- the rest of a warp's vocabulary: shuffles by lane, votes ------------------------------------
template <class T>
inline T shfl_from_emulated(T v, int src_of_lane) {
    auto& slots = g_sync->exchange[t_warp];
    std::memcpy(&slots[t_lane], &v, sizeof(T));
    __syncwarp();
    T r;
    std::memcpy(&r, &slots[src_of_lane], sizeof(T));
    __syncwarp();
    return r;
}
#define __shfl_sync(mask, v, src) shfl_from_emulated((v), (src))
#define __shfl_up_sync(mask, v, delta) shfl_from_emulated((v), t_lane >= (delta) ? t_lane - (delta) : t_lane)
inline unsigned __ballot_sync(unsigned, bool pred) {
    unsigned bits = 0;
    for (int i = 0; i < 32; ++i) bits |= (shfl_from_emulated((int)pred, i) ? 1u : 0u) << i;
    return bits;
}
inline int __ffs(unsigned x) { return x ? __builtin_ctz(x) + 1 : 0; }

// -- dynamic shared memory: one buffer, blocks run one after another --------------------------------
inline std::vector<unsigned char> g_dynamic_shared;
template <class T>
inline T* emu_dynamic_shared() {
    return reinterpret_cast<T*>(g_dynamic_shared.data());
}

// -- tensor cores (mma.cuh's operations, by their PTX fragment layouts) ------------------------------
inline float emu_h(unsigned word, int hi) { return h2f((unsigned short)(hi ? word >> 16 : word & 0xffffu)); }

// D += A @ B for m16n8k16: every lane publishes its fragments, then computes its own four outputs.
inline void mma_16816(float* d, const unsigned* a, const unsigned* b) {
    auto& f = g_sync->fragments[t_warp];
    for (int i = 0; i < 4; ++i) f[t_lane * 10 + i] = a[i];
    for (int i = 0; i < 2; ++i) f[t_lane * 10 + 4 + i] = b[i];
    __syncwarp();
    auto A = [&](int row, int col) {  // the lane and register that hold A[row][col]
        const int lane = (row % 8) * 4 + (col % 8) / 2, reg = (row >= 8 ? 1 : 0) + (col >= 8 ? 2 : 0);
        return emu_h(f[lane * 10 + reg], col & 1);
    };
    auto B = [&](int k, int n) {
        const int lane = n * 4 + (k % 8) / 2, reg = k >= 8 ? 1 : 0;
        return emu_h(f[lane * 10 + 4 + reg], k & 1);
    };
    const int g = t_lane / 4, t = t_lane % 4;
    for (int e = 0; e < 4; ++e) {
        const int row = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
        float acc = 0.f;
        for (int k = 0; k < 16; ++k) acc += A(row, k) * B(k, col);
        d[e] += acc;
    }
    __syncwarp();
}

// ldmatrix.x4: lane l gets, for each matrix i, row l/4, columns 2(l%4) and 2(l%4)+1.
inline void ldsm_x4(unsigned* r, const unsigned short* row) {
    auto& slots = g_sync->exchange[t_warp];
    slots[t_lane] = (unsigned long long)row;
    __syncwarp();
    for (int i = 0; i < 4; ++i) {
        const auto* src = (const unsigned short*)slots[8 * i + t_lane / 4];
        r[i] = (unsigned)src[2 * (t_lane % 4)] | ((unsigned)src[2 * (t_lane % 4) + 1] << 16);
    }
    __syncwarp();
}

// ldmatrix.x4.trans: lane l gets, for each matrix i, rows 2(l%4) and 2(l%4)+1 of column l/4.
inline void ldsm_x4_trans(unsigned* r, const unsigned short* row) {
    auto& slots = g_sync->exchange[t_warp];
    slots[t_lane] = (unsigned long long)row;
    __syncwarp();
    for (int i = 0; i < 4; ++i) {
        const auto* r0 = (const unsigned short*)slots[8 * i + 2 * (t_lane % 4)];
        const auto* r1 = (const unsigned short*)slots[8 * i + 2 * (t_lane % 4) + 1];
        r[i] = (unsigned)r0[t_lane / 4] | ((unsigned)r1[t_lane / 4] << 16);
    }
    __syncwarp();
}

// cp.async as a plain copy: the data is there at once, so commits and waits have nothing to do.
inline void cp_async16(void* dst, const void* src, bool valid) {
    if (valid) std::memcpy(dst, src, 16);
    else std::memset(dst, 0, 16);
}
inline void cp_async16_ca(void* dst, const void* src, bool valid) { cp_async16(dst, src, valid); }
inline void cp_async_commit() {}
template <int N>
inline void cp_async_wait() {}
inline unsigned pack_h2_rn(float lo, float hi) { return (unsigned)f2h(lo) | ((unsigned)f2h(hi) << 16); }
inline float fast_exp2(float x) { return std::exp2(x); }
