// Run the fused kernels (gemv_fused.cu's bodies, rope_cache.cu) on the SIMT emulator.
// Commands (files in DIR):
//   multi CASE WARPS DIR N_COLS N_TOK ROWS0 ROWS1 ROWS2 RB0 RB1 RB2   reads w0..2.bin x.bin [bias.bin], writes y.bin
//   gated CASE WARPS DIR N_ROWS N_COLS N_TOK RBA RBB                  reads wa.bin wb.bin x.bin, writes y.bin
//   rope_cache DIR N_TOK N_HEADS N_KV D EPS MAX_POS INTERLEAVED NORM N_SLOTS
//       reads qkv.bin pos.bin cos.bin sin.bin slots.bin [qn.bin kn.bin], writes q.bin k.bin v.bin (float16 caches);
//       the tables' width (cos.bin's size / MAX_POS) below D / 2 is partial RoPE
//   rope DIR N_TOK N_HEADS D MAX_POS INTERLEAVED THREADS   rope.cu: reads x.bin pos.bin cos.bin sin.bin, writes y.bin
// CASE picks one compiled combination of formats, token bucket and rows per block (below).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gemv.cuh"
#include "rope.cu"
#include "rope_cache.cu"

#include "host_io.h"

typedef void (*MultiFn)(const u8*, const u8*, const u8*, i64, i64, i64, int, int, int, int, const float*, int, float*,
                        const float*);
typedef void (*GatedFn)(const u8*, const u8*, i64, i64, int, int, const float*, int, float*, int);

// (case, rows per block): the combinations tests/engine/cuda/test_emulated_kernels.py asks for.
static MultiFn pick_multi(int c, int& rows) {
    if (c == 0) { rows = 4; return gemv_multi_body<FmtQ4_K, 4, FmtQ4_K, 4, FmtQ6_K, 4, 1>; }
    if (c == 1) { rows = 2; return gemv_multi_body<FmtQ8_0, 2, FmtQ5_1, 2, FmtBF16, 2, 4>; }
    if (c == 2) { rows = 2; return gemv_multi_body<FmtQ6_K, 2, FmtQ4_K, 2, FmtQ4_K, 2, 8>; }
    exit(4);
}

static GatedFn pick_gated(int c, int& half) {
    if (c == 0) { half = 2; return gemv_gated_rows<FmtQ4_K, FmtQ4_K, 1, 2, 0>; }
    if (c == 1) { half = 2; return gemv_gated_rows<FmtQ6_K, FmtQ4_K, 2, 2, 1>; }
    if (c == 2) { half = 1; return gemv_gated_rows<FmtQ8_0, FmtQ8_0, 8, 1, 0>; }
    exit(4);
}

int main(int argc, char** argv) {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "multi" && argc == 13) {
        const int c = atoi(argv[2]), warps = atoi(argv[3]);
        const std::string dir = argv[4];
        const int n_cols = atoi(argv[5]), n_tok = atoi(argv[6]);
        const int rows[3] = {atoi(argv[7]), atoi(argv[8]), atoi(argv[9])};
        const i64 rb[3] = {atoll(argv[10]), atoll(argv[11]), atoll(argv[12])};
        std::vector<uint4> w[3];
        for (int i = 0; i < 3; ++i) w[i] = read_file<uint4>(dir + "/w" + std::to_string(i) + ".bin", 2);
        if (w[2].size() <= 2) w[2] = w[1];  // two weights: the empty third points anywhere valid
        auto x = read_file<float>(dir + "/x.bin");
        auto bias = read_file<float>(dir + "/bias.bin");
        const int total = rows[0] + rows[1] + rows[2];
        std::vector<float> y((size_t)n_tok * total, NAN);
        int r = 0;
        MultiFn fn = pick_multi(c, r);
        const unsigned grid = (unsigned)((rows[0] + r - 1) / r + (rows[1] + r - 1) / r + (rows[2] + r - 1) / r);
        launch({grid, 1, 1}, {(unsigned)(32 * warps), 1, 1}, [&] {
            fn(reinterpret_cast<const u8*>(w[0].data()), reinterpret_cast<const u8*>(w[1].data()),
               reinterpret_cast<const u8*>(w[2].data()), rb[0], rb[1], rb[2], rows[0], rows[1], rows[2], n_cols,
               x.data(), n_tok, y.data(), bias.empty() ? nullptr : bias.data());
        });
        write_file(dir + "/y.bin", y);
        return 0;
    }
    if (cmd == "gated" && argc == 11) {
        const int c = atoi(argv[2]), warps = atoi(argv[3]);
        const std::string dir = argv[4];
        const int n_rows = atoi(argv[5]), n_cols = atoi(argv[6]), n_tok = atoi(argv[7]);
        const i64 rba = atoll(argv[8]), rbb = atoll(argv[9]);
        (void)argv[10];
        auto wa = read_file<uint4>(dir + "/wa.bin", 2);
        auto wb = read_file<uint4>(dir + "/wb.bin", 2);
        auto x = read_file<float>(dir + "/x.bin");
        std::vector<float> y((size_t)n_tok * n_rows, NAN);
        int half = 0;
        GatedFn fn = pick_gated(c, half);
        launch({(unsigned)((n_rows + half - 1) / half), 1, 1}, {(unsigned)(32 * warps), 1, 1}, [&] {
            fn(reinterpret_cast<const u8*>(wa.data()), reinterpret_cast<const u8*>(wb.data()), rba, rbb, n_rows,
               n_cols, x.data(), n_tok, y.data(), (int)blockIdx.x);
        });
        write_file(dir + "/y.bin", y);
        return 0;
    }
    if (cmd == "rope_cache" && argc == 12) {
        const std::string dir = argv[2];
        const int n_tok = atoi(argv[3]), n_heads = atoi(argv[4]), n_kv = atoi(argv[5]), d = atoi(argv[6]);
        const float eps = (float)atof(argv[7]);
        const int max_pos = atoi(argv[8]), interleaved = atoi(argv[9]), norm = atoi(argv[10]), n_slots = atoi(argv[11]);
        auto qkv = read_file<float>(dir + "/qkv.bin");
        auto pos = read_file<int>(dir + "/pos.bin");
        auto cos_t = read_file<float>(dir + "/cos.bin");
        auto sin_t = read_file<float>(dir + "/sin.bin");
        auto slots = read_file<int>(dir + "/slots.bin");
        auto qn = read_file<float>(dir + "/qn.bin");
        auto kn = read_file<float>(dir + "/kn.bin");
        std::vector<float> q((size_t)n_tok * n_heads * d, NAN);
        std::vector<u16> k((size_t)n_slots * n_kv * d, 0x7e00u), v((size_t)n_slots * n_kv * d, 0x7e00u);  // NaN
        // rope_cache.py's launch: heads_per_block(d) = max(1, 256 / (d / 2)) heads of d / 2 threads a block
        const int hpb = std::max(1, 256 / (d / 2)), n_rows = n_heads + 2 * n_kv;
        launch({(unsigned)n_tok, (unsigned)((n_rows + hpb - 1) / hpb), 1}, {(unsigned)(hpb * d / 2), 1, 1}, [&] {
            rope_cache(qkv.data(), n_heads, n_kv, d, norm ? qn.data() : nullptr, norm ? kn.data() : nullptr, eps,
                       pos.data(), cos_t.data(), sin_t.data(), max_pos, (int)(cos_t.size() / max_pos), interleaved,
                       k.data(), v.data(), slots.data(), q.data());  // table width < d / 2: partial RoPE
        });
        write_file(dir + "/q.bin", q);
        write_file(dir + "/k.bin", k);
        write_file(dir + "/v.bin", v);
        return 0;
    }
    if (cmd == "rope" && argc == 9) {
        const std::string dir = argv[2];
        const int n_tok = atoi(argv[3]), n_heads = atoi(argv[4]), d = atoi(argv[5]), max_pos = atoi(argv[6]);
        const int interleaved = atoi(argv[7]), threads = atoi(argv[8]);
        auto x = read_required<float>(dir + "/x.bin");
        auto pos = read_required<int>(dir + "/pos.bin");
        auto cos_t = read_required<float>(dir + "/cos.bin");
        auto sin_t = read_required<float>(dir + "/sin.bin");
        std::vector<float> y(x.size(), NAN);
        const long work = (long)n_tok * n_heads * (d / 2);
        launch({(unsigned)((work + threads - 1) / threads), 1, 1}, {(unsigned)threads, 1, 1}, [&] {
            rope(x.data(), pos.data(), cos_t.data(), sin_t.data(), y.data(), n_tok, n_heads, d, max_pos,
                 (int)(cos_t.size() / max_pos), interleaved);
        });
        write_file(dir + "/y.bin", y);
        return 0;
    }
    return 2;
}
