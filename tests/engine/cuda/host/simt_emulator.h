// A small SIMT emulator: runs Paddock's CUDA kernels as host C++ so that their indexing,
// barriers and warp shuffles are tested on machines without a GPU (CI).
//
// Every CUDA thread of a block is a std::thread; blocks run one after another.
// __syncthreads is a barrier over the block, __shfl_xor_sync exchanges values through a
// per-warp buffer between two warp barriers, and __shared__ variables become function
// statics (shared by the block's threads; blocks never overlap). A kernel whose warps
// diverge around a shuffle or barrier deadlocks here, as it would misbehave on the GPU.
// Compile with -std=c++20 -DPADDOCK_HOST_SHIM -include simt_emulator.h.
#pragma once
#include <array>
#include <barrier>
#include <memory>
#include <thread>
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

inline dim3 blockIdx, blockDim, gridDim;
inline thread_local dim3 threadIdx;

struct BlockSync {
    std::unique_ptr<std::barrier<>> block;
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    std::vector<std::array<unsigned long long, 32>> exchange;
};

inline BlockSync* g_sync = nullptr;
inline thread_local int t_warp = 0, t_lane = 0;

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

// Run `body` (a kernel call with its arguments bound) over the grid.
template <class F>
inline void launch(dim3 grid, dim3 block, F body) {
    gridDim = grid;
    blockDim = block;
    const int n = (int)(block.x * block.y * block.z);
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                blockIdx = {bx, by, bz};
                BlockSync sync;
                sync.block = std::make_unique<std::barrier<>>(n);
                for (int w = 0; w * 32 < n; ++w) {
                    sync.warps.push_back(std::make_unique<std::barrier<>>(std::min(32, n - 32 * w)));
                    sync.exchange.emplace_back();
                }
                g_sync = &sync;
                std::vector<std::thread> threads;
                threads.reserve(n);
                for (int tid = 0; tid < n; ++tid)
                    threads.emplace_back([tid, block, &body] {
                        threadIdx = {tid % block.x, (tid / block.x) % block.y, tid / (block.x * block.y)};
                        t_warp = tid / 32;
                        t_lane = tid % 32;
                        body();
                    });
                for (auto& t : threads) t.join();
            }
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
