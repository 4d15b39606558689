// Run attention_decode.cu's kernels on the SIMT emulator.
// argv: dir head_dim gmax n_seqs n_heads n_kv block_size table_stride scale softcap window n_blocks.
// Reads dir/{q,k,v,seq_lens,tables}.bin, writes dir/out.bin.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define PADDOCK_ALL_VARIANTS
#include "attention_decode.cu"

#include "host_io.h"

typedef void (*DecFn)(const float*, const u16*, const u16*, const int*, const int*, int, int, int, int, float, float,
                      int, float*, float*, float*, float*, int*);

static DecFn pick(int d, int g) {
#define PICK(D, G) \
    if (d == D && g == G) return attn_dec_d##D##_g##G;
    PICK(64, 1) PICK(64, 2) PICK(64, 4) PICK(64, 8) PICK(64, 16)
    PICK(128, 1) PICK(128, 2) PICK(128, 4) PICK(128, 8)
    PICK(256, 1) PICK(256, 2) PICK(256, 4)
    exit(4);
}

int main(int argc, char** argv) {
    if (argc != 13) return 2;
    const std::string dir = argv[1];
    const int d = atoi(argv[2]), g = atoi(argv[3]), n_seqs = atoi(argv[4]), n_heads = atoi(argv[5]);
    const int n_kv = atoi(argv[6]), block_size = atoi(argv[7]), stride = atoi(argv[8]);
    const float scale = (float)atof(argv[9]), softcap = (float)atof(argv[10]);
    const int window = atoi(argv[11]), blocks = atoi(argv[12]);
    auto q = read_required<float>(dir + "/q.bin");
    auto k = read_required<u16>(dir + "/k.bin");
    auto v = read_required<u16>(dir + "/v.bin");
    auto seq_lens = read_required<int>(dir + "/seq_lens.bin");
    auto tables = read_required<int>(dir + "/tables.bin");
    std::vector<float> out((size_t)n_seqs * n_heads * d, NAN);
    std::vector<float> acc((size_t)n_seqs * n_heads * blocks * d, NAN), m((size_t)n_seqs * n_heads * blocks, NAN),
        l((size_t)n_seqs * n_heads * blocks, NAN);
    std::vector<int> counters((size_t)n_seqs * n_kv, 0);
    DecFn fn = pick(d, g);
    // Twice: the counters must be back at zero after a launch for the next one to merge.
    for (int round = 0; round < 2; ++round) {
        std::fill(out.begin(), out.end(), NAN);
        launch({(unsigned)n_seqs, (unsigned)n_kv, (unsigned)blocks}, {128, 1, 1}, [&] {
            fn(q.data(), k.data(), v.data(), seq_lens.data(), tables.data(), stride, n_heads, n_kv, block_size, scale,
               softcap, window, out.data(), acc.data(), m.data(), l.data(), counters.data());
        });
    }
    for (int c : counters)
        if (c != 0) return 5;
    write_file(dir + "/out.bin", out);
    return 0;
}
