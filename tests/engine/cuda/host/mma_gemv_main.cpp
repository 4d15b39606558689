// Run gemv_mma.cu (quantized weights times a few tokens on tensor cores) on the SIMT emulator.
// Build with -DGM_F0/F1/F2 (formats), -DGM_MT, -DGM_NT, -DGM_WARPS (the launch shape).
// argv and the files it reads: mma_gemv_inputs.h. Writes dir/y.bin (float32 [n_tok, rows0 + rows1 + rows2]).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gemv_mma.cu"

#include "host_io.h"
#include "mma_gemv_inputs.h"

int main(int argc, char** argv) {
    if (argc != 10) return 2;
    const MmaGemvInputs in(argv);
    std::vector<float> y((size_t)in.n_tok * in.total, NAN);
    constexpr int tile_rows = 16 * GM_MT;
    unsigned blocks = 0;
    for (int r : in.rows) blocks += (unsigned)((r + tile_rows - 1) / tile_rows);
    launch({blocks, 1, 1}, {32 * GM_WARPS, 1, 1}, [&] {
        gemv_mma(in.bytes(0), in.bytes(1), in.bytes(2), in.rb[0], in.rb[1], in.rb[2], in.rows[0], in.rows[1],
                 in.rows[2], in.n_cols, in.x.data(), in.n_tok, y.data(), in.bias.empty() ? nullptr : in.bias.data());
    });
    write_file(in.dir + "/y.bin", y);
    return 0;
}
