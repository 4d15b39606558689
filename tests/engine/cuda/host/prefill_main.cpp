// Run attention_prefill.cu's kernels on the SIMT emulator.
// argv: dir head_dim n_tok n_heads n_kv block_size n_seqs table_stride scale softcap window num_splits.
// Reads dir/{q,k,v,qsl,seq_lens,tables}.bin (and sinks.bin if there), writes dir/out.bin. Built with
// -DKV_FP8=1: k.bin and v.bin are e4m3 codes with their block scales in ks.bin, vs.bin.
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#define PADDOCK_ALL_VARIANTS
#include "attention_prefill.cu"

#include "host_io.h"

#if PF_FP8
typedef void (*PrefillFn)(const float*, const u8*, const u8*, const int*, const int*, const int*, int, int, int, int,
                          int, float, float, int, float*, float*, float*, const int*, const float*, const float*,
                          const float*);
#else
typedef void (*PrefillFn)(const float*, const u16*, const u16*, const int*, const int*, const int*, int, int, int,
                          int, int, float, float, int, float*, float*, float*, const int*, const float*);
#endif

static PrefillFn pick(int d, size_t* smem) {
#define PICK(D)                          \
    if (d == D) {                        \
        *smem = PF_SMEM_BYTES(D);        \
        return attn_prefill_d##D;        \
    }
    PICK(64) PICK(128) PICK(256) PICK(512)
    exit(4);
}

int main(int argc, char** argv) {
    if (argc != 13) return 2;
    const std::string dir = argv[1];
    const int d = atoi(argv[2]), n_tok = atoi(argv[3]), n_heads = atoi(argv[4]), n_kv = atoi(argv[5]);
    const int block_size = atoi(argv[6]), n_seqs = atoi(argv[7]), stride = atoi(argv[8]);
    const float scale = (float)atof(argv[9]), softcap = (float)atof(argv[10]);
    const int window = atoi(argv[11]), splits = atoi(argv[12]);
    auto q = read_required<float>(dir + "/q.bin");
    auto k = read_required<pf_kv_t>(dir + "/k.bin");
    auto v = read_required<pf_kv_t>(dir + "/v.bin");
    auto ks = read_file<float>(dir + "/ks.bin");  // KV_FP8 builds: the block scales
    auto vs = read_file<float>(dir + "/vs.bin");
    auto qsl = read_required<int>(dir + "/qsl.bin");
    auto seq_lens = read_required<int>(dir + "/seq_lens.bin");
    auto tables = read_required<int>(dir + "/tables.bin");
    auto sinks = read_file<float>(dir + "/sinks.bin");  // optional: the heads' sink logits
    const float* sink = sinks.empty() ? nullptr : sinks.data();
    const size_t rows = (size_t)n_tok * n_heads;
    std::vector<float> out(rows * d, NAN), part_o(rows * splits * d, NAN), part_ml(rows * splits * 2, NAN);
    size_t smem = 0;
    PrefillFn fn = pick(d, &smem);
    g_dynamic_shared.assign(smem, 0xff);  // garbage, as on the device
    const int bm = d == 64 ? PfShape<64>::BM : d == 128 ? PfShape<128>::BM : d == 256 ? PfShape<256>::BM : PfShape<512>::BM;
    const int parts = d == 512 ? PfShape<512>::PARTS : 1;  // blocks per (row tile, KV head): value columns
    const unsigned tiles = (unsigned)((n_tok * (n_heads / n_kv) + bm - 1) / bm + n_seqs);
    launch({tiles, (unsigned)(n_kv * parts), (unsigned)splits}, {PF_WARPS * 32, 1, 1}, [&] {
        fn(q.data(), k.data(), v.data(), qsl.data(), seq_lens.data(), tables.data(), stride, n_seqs, n_heads, n_kv,
           block_size, scale, softcap, window, out.data(), part_o.data(), part_ml.data(), nullptr, sink
#if PF_FP8
           , ks.data(), vs.data()
#endif
        );
    });
    if (splits > 1)
        launch({(unsigned)rows, 1, 1}, {(unsigned)d, 1, 1},
               [&] { attn_prefill_merge(part_o.data(), part_ml.data(), splits, d, out.data(), nullptr, nullptr, sink, n_heads); });
    write_file(dir + "/out.bin", out);
    return 0;
}
