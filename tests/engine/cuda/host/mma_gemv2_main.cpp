// Run gemv_mma2.cu (the staged-x kernel of few-token products on tensor cores) on the SIMT emulator.
// Build with -DGM_F0/F1/F2 (formats), -DGM_MT, -DGM_NT, -DGM_RW, -DGM_KW (the block's shape).
// argv and the files it reads: mma_gemv_inputs.h's, then splits (gridDim.y). Writes dir/y.bin
// (float32 [n_tok, rows0 + rows1 + rows2]). y starts as NaN: the pre-pass (gemv_mma2_x16, run first as
// gemv_mma.py does) zeroes it for several splits, else every output must be written by the product.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gemv_mma2.cu"

#include "host_io.h"
#include "mma_gemv_inputs.h"

int main(int argc, char** argv) {
    if (argc != 11) return 2;
    const MmaGemvInputs in(argv);
    const unsigned splits = (unsigned)atoi(argv[10]);
    std::vector<float> y((size_t)in.n_tok * in.total, NAN);
    std::vector<u32> xh(in.x.size() / 2);
    unsigned blocks = 0;
    for (int r : in.rows) blocks += (unsigned)((r + gm2::ROWS - 1) / gm2::ROWS);
    launch({3, 1, 1}, {64, 1, 1}, [&] {  // a small grid: its stride loops run more than once
        gemv_mma2_x16(in.x.data(), xh.data(), (int)in.x.size(), splits > 1 ? y.data() : nullptr, (int)y.size());
    });
    launch({blocks, splits, 1}, {gm2::THREADS, 1, 1}, [&] {
        gemv_mma2(in.bytes(0), in.bytes(1), in.bytes(2), in.rb[0], in.rb[1], in.rb[2], in.rows[0], in.rows[1],
                  in.rows[2], in.n_cols, reinterpret_cast<const u16*>(xh.data()), in.n_tok, y.data(),
                  in.bias.empty() ? nullptr : in.bias.data());
    });
    write_file(in.dir + "/y.bin", y);
    return 0;
}
