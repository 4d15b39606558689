// The emulator's own semantics (simt_emulator.h), checked on two small kernels: `order` writes through
// shared memory, a barrier and shuffles, over several blocks; `diverge` makes half a block wait at a
// barrier the other half never reaches, which must end in the reported deadlock, not a hang.
// Usage: selfcheck_main order OUT | selfcheck_main diverge
#include <cstring>

#include "host_io.h"

__global__ void order(int* out) {
    __shared__ int seen[128];
    const int t = threadIdx.x;
    seen[t] = 1000 * blockIdx.x + t;
    __syncthreads();
    const int mirrored = seen[blockDim.x - 1 - t];  // written by another warp before the barrier
    out[blockIdx.x * blockDim.x + t] = mirrored + 100000 * __shfl_xor_sync(0xffffffffu, t % 32, 5);
}

__global__ void diverge(int* out) {
    if (threadIdx.x < 16) __syncthreads();
    out[threadIdx.x] = 1;
}

int main(int argc, char** argv) {
    if (argc == 3 && std::strcmp(argv[1], "order") == 0) {
        const unsigned blocks = 3, threads = 128;
        std::vector<int> out(blocks * threads);
        launch(dim3{blocks}, dim3{threads}, [&] { order(out.data()); });
        write_file(argv[2], out);
        return 0;
    }
    if (argc == 2 && std::strcmp(argv[1], "diverge") == 0) {
        std::vector<int> out(64);
        launch(dim3{1}, dim3{64}, [&] { diverge(out.data()); });
        return 0;  // not reached: the emulator aborts
    }
    return 2;
}
