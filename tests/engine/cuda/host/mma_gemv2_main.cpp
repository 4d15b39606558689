// Run gemv_mma2.cu (the staged-x kernel of few-token products on tensor cores) on the SIMT emulator.
// Build with -DGM_F0/F1/F2 (formats), -DGM_MT, -DGM_NT, -DGM_RW, -DGM_KW (the block's shape).
// argv: dir n_cols rows0 rows1 rows2 row_bytes0 row_bytes1 row_bytes2 n_tok splits (gridDim.y).
// Reads dir/w0..2.bin (w1, w2 only for rows > 0), dir/x.bin and dir/bias.bin when present;
// writes dir/y.bin (float32 [n_tok, rows0 + rows1 + rows2]). y starts as NaN: the pre-pass
// (gemv_mma2_x16, run first as gemv_mma.py does) zeroes it for several splits, else every output
// must be written by the product.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gemv_mma2.cu"

#include "host_io.h"

int main(int argc, char** argv) {
    if (argc != 11) return 2;
    const std::string dir = argv[1];
    const int n_cols = atoi(argv[2]);
    const int rows[3] = {atoi(argv[3]), atoi(argv[4]), atoi(argv[5])};
    const i64 rb[3] = {atoll(argv[6]), atoll(argv[7]), atoll(argv[8])};
    const int n_tok = atoi(argv[9]);
    const unsigned splits = (unsigned)atoi(argv[10]);
    std::vector<uint4> w[3];
    for (int i = 0; i < 3; ++i) w[i] = read_file<uint4>(dir + "/w" + std::to_string(i) + ".bin", 2);
    for (int i = 1; i < 3; ++i)
        if (rows[i] == 0) w[i] = w[0];  // an absent weight points anywhere valid
    auto x = read_required<float>(dir + "/x.bin");
    auto bias = read_file<float>(dir + "/bias.bin");
    const int total = rows[0] + rows[1] + rows[2];
    std::vector<float> y((size_t)n_tok * total, NAN);
    std::vector<u32> xh(x.size() / 2);
    unsigned blocks = 0;
    for (int r : rows) blocks += (unsigned)((r + gm2::ROWS - 1) / gm2::ROWS);
    auto bytes = [](const std::vector<uint4>& v) { return reinterpret_cast<const u8*>(v.data()); };
    launch({3, 1, 1}, {64, 1, 1}, [&] {  // a small grid: its stride loops run more than once
        gemv_mma2_x16(x.data(), xh.data(), (int)x.size(), splits > 1 ? y.data() : nullptr, (int)y.size());
    });
    launch({blocks, splits, 1}, {gm2::THREADS, 1, 1}, [&] {
        gemv_mma2(bytes(w[0]), bytes(w[1]), bytes(w[2]), rb[0], rb[1], rb[2], rows[0], rows[1], rows[2], n_cols,
                  reinterpret_cast<const u16*>(xh.data()), n_tok, y.data(), bias.empty() ? nullptr : bias.data());
    });
    write_file(dir + "/y.bin", y);
    return 0;
}
