// Run attention.cu's kernels on the SIMT emulator.
// argv: dir head_dim gmax n_tok n_heads n_kv block_size n_seqs table_stride scale softcap window
//       num_splits split_len. Reads dir/{q,k,v,qsl,seq_lens,tables}.bin, writes dir/out.bin. Built with
//       -DKV_FP8=1: k.bin and v.bin are e4m3 codes with their block scales in ks.bin, vs.bin.
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#define PADDOCK_ALL_VARIANTS
#include "attention.cu"

#include "host_io.h"

#if ATTN_FP8
typedef void (*AttnFn)(const float*, const u8*, const u8*, const int*, const int*, const int*, int, int, int, int, int,
                       float, float, int, int, float*, float*, float*, float*, int*, const float*, const float*);
#else
typedef void (*AttnFn)(const float*, const u16*, const u16*, const int*, const int*, const int*, int, int, int, int,
                       int, float, float, int, int, float*, float*, float*, float*, int*);
#endif

static AttnFn pick(int d, int g) {
#define PICK(D, G) \
    if (d == D && g == G) return attn_d##D##_g##G;
#define PICK_D(D) PICK(D, 1) PICK(D, 2) PICK(D, 4) PICK(D, 8) PICK(D, 16)
    PICK_D(16) PICK_D(32) PICK_D(64) PICK_D(128) PICK_D(256) PICK_D(512)
    exit(4);
}

int main(int argc, char** argv) {
    if (argc != 15) return 2;
    const std::string dir = argv[1];
    const int d = atoi(argv[2]), g = atoi(argv[3]), n_tok = atoi(argv[4]), n_heads = atoi(argv[5]);
    const int n_kv = atoi(argv[6]), block_size = atoi(argv[7]), n_seqs = atoi(argv[8]), stride = atoi(argv[9]);
    const float scale = (float)atof(argv[10]), softcap = (float)atof(argv[11]);
    const int window = atoi(argv[12]), splits = atoi(argv[13]), split_len = atoi(argv[14]);
    auto q = read_required<float>(dir + "/q.bin");
    auto k = read_required<attn_kv_t>(dir + "/k.bin");
    auto v = read_required<attn_kv_t>(dir + "/v.bin");
    auto ks = read_file<float>(dir + "/ks.bin");  // KV_FP8 builds: the block scales
    auto vs = read_file<float>(dir + "/vs.bin");
    auto qsl = read_required<int>(dir + "/qsl.bin");
    auto seq_lens = read_required<int>(dir + "/seq_lens.bin");
    auto tables = read_required<int>(dir + "/tables.bin");
    std::vector<float> out((size_t)n_tok * n_heads * d, NAN);
    std::vector<float> acc((size_t)n_tok * n_heads * splits * d, NAN), m((size_t)n_tok * n_heads * splits, NAN),
        l((size_t)n_tok * n_heads * splits, NAN);
    std::vector<int> counters((size_t)n_tok * n_kv, 0);
    AttnFn fn = pick(d, g);
    // Twice: the split counters must be back at zero after a launch for the next one to merge.
    for (int round = 0; round < 2; ++round) {
        std::fill(out.begin(), out.end(), NAN);
        launch({(unsigned)n_tok, (unsigned)n_kv, (unsigned)splits}, {128, 1, 1}, [&] {
            fn(q.data(), k.data(), v.data(), qsl.data(), seq_lens.data(), tables.data(), stride, n_seqs, n_heads,
               n_kv, block_size, scale, softcap, window, split_len, out.data(), splits == 1 ? nullptr : acc.data(),
               splits == 1 ? nullptr : m.data(), splits == 1 ? nullptr : l.data(),
               splits == 1 ? nullptr : counters.data()
#if ATTN_FP8
               , ks.data(), vs.data()
#endif
            );
        });
    }
    for (int c : counters)
        if (c != 0) return 5;
    write_file(dir + "/out.bin", out);
    return 0;
}
