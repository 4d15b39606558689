// Run gemv_mma.cu (quantized weights times a few tokens on tensor cores) on the SIMT emulator.
// Build with -DGM_F0/F1/F2 (formats), -DGM_MT, -DGM_NT, -DGM_WARPS (the launch shape).
// argv: dir n_cols rows0 rows1 rows2 row_bytes0 row_bytes1 row_bytes2 n_tok.
// Reads dir/w0..2.bin (w1, w2 only for rows > 0), dir/x.bin and dir/bias.bin when present;
// writes dir/y.bin (float32 [n_tok, rows0 + rows1 + rows2]).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gemv_mma.cu"

#include "host_io.h"

int main(int argc, char** argv) {
    if (argc != 10) return 2;
    const std::string dir = argv[1];
    const int n_cols = atoi(argv[2]);
    const int rows[3] = {atoi(argv[3]), atoi(argv[4]), atoi(argv[5])};
    const i64 rb[3] = {atoll(argv[6]), atoll(argv[7]), atoll(argv[8])};
    const int n_tok = atoi(argv[9]);
    std::vector<uint4> w[3];
    for (int i = 0; i < 3; ++i) w[i] = read_file<uint4>(dir + "/w" + std::to_string(i) + ".bin", 2);
    for (int i = 1; i < 3; ++i)
        if (rows[i] == 0) w[i] = w[0];  // an absent weight points anywhere valid
    auto x = read_required<float>(dir + "/x.bin");
    auto bias = read_file<float>(dir + "/bias.bin");
    const int total = rows[0] + rows[1] + rows[2];
    std::vector<float> y((size_t)n_tok * total, NAN);
    constexpr int tile_rows = 16 * GM_MT;
    unsigned blocks = 0;
    for (int r : rows) blocks += (unsigned)((r + tile_rows - 1) / tile_rows);
    auto bytes = [](const std::vector<uint4>& v) { return reinterpret_cast<const u8*>(v.data()); };
    launch({blocks, 1, 1}, {32 * GM_WARPS, 1, 1}, [&] {
        gemv_mma(bytes(w[0]), bytes(w[1]), bytes(w[2]), rb[0], rb[1], rb[2], rows[0], rows[1], rows[2], n_cols,
                 x.data(), n_tok, y.data(), bias.empty() ? nullptr : bias.data());
    });
    write_file(dir + "/y.bin", y);
    return 0;
}
