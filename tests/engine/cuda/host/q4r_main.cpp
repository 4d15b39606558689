// Run gemv_q4r.cu (quantized weights repacked for the tensor cores) on the SIMT emulator: each weight packed
// into one stacked layout (q4r_pack, or q8r_pack in a -DQ4R_FMT=1 build), the float16 pre-pass, then the
// product. Build with -DQ4R_MT, -DQ4R_NT (and -DQ4R_FMT, -DQ4R_WSMEM, -DQ4R_STAGES).
// argv: dir n_cols n_tok splits [interleave] rows0 [rows1 ...]; a row count followed by "q6" (e.g. 64q6) is a
// Q6_K weight (byte layout only); "interleave" takes two weights of one shape and alternates their 16-row tiles
// (a gate/up pair: a -DQ4R_ACT build writes act(first) * second, [n_tok, rows0]). Reads dir/w<i>.bin (the GGUF rows), dir/x.bin (float32 [n_tok, n_cols]), dir/bias.bin
// when present. Writes dir/y.bin (float32 [n_tok, sum rows]; NaN where never written) and dir/counters.bin
// (the split counters after the launch: all zero again).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gemv_q4r.cu"

#include "host_io.h"

int main(int argc, char** argv) {
    if (argc < 6) return 2;
    const std::string dir = argv[1];
    const int n_cols = atoi(argv[2]), n_tok = atoi(argv[3]);
    const unsigned splits = (unsigned)atoi(argv[4]);
    const bool interleave = std::string(argv[5]) == "interleave";
    std::vector<int> rows;
    std::vector<bool> q6;
    for (int i = interleave ? 6 : 5; i < argc; ++i) {
        rows.push_back(atoi(argv[i]));
        q6.push_back(std::string(argv[i]).find("q6") != std::string::npos);
    }
    int total = 0;
    for (int r : rows) total += r;
    const int tiles = total / 16, n_chunks = n_cols / 64;
    const bool bytes = Q4R_FMT == 1;
    std::vector<uint4> codes((size_t)tiles * n_chunks * (bytes ? 64 : 32)), scales((size_t)tiles * n_chunks * (bytes ? 16 : 8));
    std::vector<float> row_scale((size_t)tiles * 16);
    int offset = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
        const auto w = read_required<u8>(dir + "/w" + std::to_string(i) + ".bin");
        const i64 row_bytes = (i64)n_cols / 256 * (q6[i] ? 210 : 144);
        if (q6[i] && !bytes) return 4;
        launch({(unsigned)(rows[i] / 16), 1, 1}, {q4r::PACK_THREADS, 1, 1}, [&] {
            if (bytes)
                q8r_pack(w.data(), row_bytes, rows[i], n_cols, offset, q6[i] ? 1 : 0, codes.data(),
                         reinterpret_cast<uint2*>(scales.data()), row_scale.data());
            else
                q4r_pack(w.data(), row_bytes, rows[i], n_cols, offset, codes.data(), scales.data(), row_scale.data());
        });
        offset += rows[i] / 16;
    }
    const auto x = read_required<float>(dir + "/x.bin");
    const auto bias = read_file<float>(dir + "/bias.bin");
    std::vector<u32> xh(x.size() / 2);
    if (interleave) {  // tile 2 i: the first weight's tile i; 2 i + 1: the second's
        if (rows.size() != 2 || rows[0] != rows[1]) return 5;
        const size_t per_code = codes.size() / tiles, per_scale = scales.size() / tiles, half = tiles / 2;
        auto alternate = [&](auto& v, size_t per) {
            auto copy = v;
            for (size_t i = 0; i < half; ++i)
                for (int which = 0; which < 2; ++which)
                    std::copy_n(copy.begin() + (which * half + i) * per, per, v.begin() + (2 * i + which) * per);
        };
        alternate(codes, per_code);
        alternate(scales, per_scale);
        alternate(row_scale, 16);
    }
    launch({2, 1, 1}, {64, 1, 1}, [&] { gemv_q4r_x16(x.data(), xh.data(), (int)x.size()); });
    std::vector<float> y((size_t)n_tok * total, NAN), work((size_t)splits * n_tok * total, NAN);
    const unsigned blocks = (unsigned)((total + q4r::ROWS - 1) / q4r::ROWS);
    std::vector<int> counters(blocks, 0);
    g_dynamic_shared.assign(q4r::SMEM_BYTES, 0xff);  // garbage, as on the device
    launch({blocks, splits, 1}, {q4r::THREADS, 1, 1}, [&] {
        gemv_q4r(codes.data(), scales.data(), row_scale.data(), total, n_cols, reinterpret_cast<const u16*>(xh.data()),
                 n_tok, y.data(), bias.empty() ? nullptr : bias.data(), work.data(), counters.data(), interleave ? 1 : 0);
    });
    if (Q4R_ACT >= 0) y.resize((size_t)n_tok * total / 2);
    write_file(dir + "/y.bin", y);
    write_file(dir + "/counters.bin", counters);
    return 0;
}
