// The inputs both gemv_mma emulator mains read (mma_gemv_main.cpp, mma_gemv2_main.cpp):
// argv dir n_cols rows0 rows1 rows2 row_bytes0 row_bytes1 row_bytes2 n_tok [...], then dir/w0..2.bin
// (w1, w2 only for rows > 0), dir/x.bin and dir/bias.bin when present. Include after host_io.h.
#pragma once
#include <cstdlib>
#include <string>
#include <vector>

struct MmaGemvInputs {
    std::string dir;
    int n_cols = 0, n_tok = 0, total = 0;
    int rows[3] = {0, 0, 0};
    i64 rb[3] = {0, 0, 0};
    std::vector<uint4> w[3];
    std::vector<float> x, bias;

    explicit MmaGemvInputs(char** argv) : dir(argv[1]) {
        n_cols = atoi(argv[2]);
        for (int i = 0; i < 3; ++i) {
            rows[i] = atoi(argv[3 + i]);
            rb[i] = atoll(argv[6 + i]);
        }
        n_tok = atoi(argv[9]);
        for (int i = 0; i < 3; ++i) w[i] = read_file<uint4>(dir + "/w" + std::to_string(i) + ".bin", 2);
        for (int i = 1; i < 3; ++i)
            if (rows[i] == 0) w[i] = w[0];  // an absent weight points anywhere valid
        x = read_required<float>(dir + "/x.bin");
        bias = read_file<float>(dir + "/bias.bin");
        total = rows[0] + rows[1] + rows[2];
    }

    const u8* bytes(int i) const { return reinterpret_cast<const u8*>(w[i].data()); }
};
