// Run a cascade decode (kernels/attention_cascade.py) on the SIMT emulator: attention_decode.cu over
// each sequence's own keys (from the key floor, with its log-sum-exp), attention_prefill.cu over the
// shared keys for the batch as one pseudo sequence (with the key limit), and attn_prefill_merge.
// argv: dir head_dim gmax n_seqs n_heads n_kv block_size table_stride scale softcap n_blocks splits shared.
// Reads dir/{q,k,v,seq_lens,tables}.bin; writes dir/out.bin, out_h.bin (the same merge in float16), own.bin (the
// decode part) and lse.bin. Built
// with -DKV_FP8=1: k.bin and v.bin are e4m3 codes with their block scales in ks.bin, vs.bin.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define PADDOCK_ALL_VARIANTS
#include "attention_decode.cu"
#include "attention_prefill.cu"

#include "host_io.h"

#if DEC_FP8
#define SCALE_TYPES , const float*, const float*
#define SCALES , ks.data(), vs.data()
#else
#define SCALE_TYPES
#define SCALES
#endif
typedef void (*DecFn)(const float*, const dec_kv_t*, const dec_kv_t*, const int*, const int*, int, int, int, int, float,
                      float, int, float*, float*, float*, float*, int*, const int*, float*, const float* SCALE_TYPES);
typedef void (*PrefillFn)(const float*, const pf_kv_t*, const pf_kv_t*, const int*, const int*, const int*, int, int,
                          int, int, int, float, float, int, float*, float*, float*, const int*,
                          const float* SCALE_TYPES);

static DecFn pick_decode(int d, int g) {
#define PICK(D, G) \
    if (d == D && g == G) return attn_dec_d##D##_g##G;
    PICK(64, 1) PICK(64, 2) PICK(64, 4) PICK(64, 8) PICK(64, 16)
    PICK(128, 1) PICK(128, 2) PICK(128, 4) PICK(128, 8)
    PICK(256, 1) PICK(256, 2) PICK(256, 4)
#undef PICK
    exit(4);
}

static PrefillFn pick_prefill(int d, size_t* smem, int* bm) {
#define PICK(D)                   \
    if (d == D) {                 \
        *smem = PF_SMEM_BYTES(D); \
        *bm = PfShape<D>::BM;     \
        return attn_prefill_d##D; \
    }
    PICK(64) PICK(128) PICK(256)
#undef PICK
    exit(4);
}

int main(int argc, char** argv) {
    if (argc != 14) return 2;
    const std::string dir = argv[1];
    const int d = atoi(argv[2]), g = atoi(argv[3]), n_seqs = atoi(argv[4]), n_heads = atoi(argv[5]);
    const int n_kv = atoi(argv[6]), block_size = atoi(argv[7]), stride = atoi(argv[8]);
    const float scale = (float)atof(argv[9]), softcap = (float)atof(argv[10]);
    const int blocks = atoi(argv[11]), splits = atoi(argv[12]), shared = atoi(argv[13]);
    auto q = read_required<float>(dir + "/q.bin");
    auto k = read_required<dec_kv_t>(dir + "/k.bin");
    auto v = read_required<dec_kv_t>(dir + "/v.bin");
    auto ks = read_file<float>(dir + "/ks.bin");  // KV_FP8 builds: the block scales
    auto vs = read_file<float>(dir + "/vs.bin");
    auto seq_lens = read_required<int>(dir + "/seq_lens.bin");
    auto tables = read_required<int>(dir + "/tables.bin");
    const size_t rows = (size_t)n_seqs * n_heads;
    std::vector<float> own(rows * d, NAN), lse(rows, NAN), out(rows * d, NAN);
    std::vector<float> acc(rows * blocks * d, NAN), m(rows * blocks, NAN), l(rows * blocks, NAN);
    std::vector<int> counters((size_t)n_seqs * n_kv, 0);
    const std::vector<int> floor_at = {shared};
    launch({(unsigned)n_seqs, (unsigned)n_kv, (unsigned)blocks}, {128, 1, 1}, [&] {
        pick_decode(d, g)(q.data(), k.data(), v.data(), seq_lens.data(), tables.data(), stride, n_heads, n_kv,
                          block_size, scale, softcap, 0, own.data(), acc.data(), m.data(), l.data(), counters.data(),
                          floor_at.data(), lse.data(), nullptr SCALES);
    });
    const std::vector<int> qsl = {0, n_seqs}, pseudo_len = {shared - 1 + n_seqs};
    std::vector<float> part_o(rows * splits * d, NAN), part_ml(rows * splits * 2, NAN);
    size_t smem = 0;
    int bm = 0;
    PrefillFn prefill = pick_prefill(d, &smem, &bm);
    g_dynamic_shared.assign(smem, 0xff);  // garbage, as on the device
    const unsigned tiles = (unsigned)((n_seqs * (n_heads / n_kv) + bm - 1) / bm + 1);
    launch({tiles, (unsigned)n_kv, (unsigned)splits}, {PF_WARPS * 32, 1, 1}, [&] {
        prefill(q.data(), k.data(), v.data(), qsl.data(), pseudo_len.data(), tables.data(), stride, 1, n_heads, n_kv,
                block_size, scale, softcap, 0, part_o.data(), part_o.data(), part_ml.data(), floor_at.data(),
                nullptr SCALES);
    });
    launch({(unsigned)rows, 1, 1}, {(unsigned)d, 1, 1}, [&] {
        attn_prefill_merge(part_o.data(), part_ml.data(), splits, d, out.data(), own.data(), lse.data(), nullptr, n_heads);
    });
    std::vector<u16> out_h(rows * d, 0xffff);  // the float16 merge (a product that reads float16 comes next)
    launch({(unsigned)rows, 1, 1}, {(unsigned)d, 1, 1}, [&] {
        attn_prefill_merge_h(part_o.data(), part_ml.data(), splits, d, out_h.data(), own.data(), lse.data(), nullptr,
                             n_heads);
    });
    write_file(dir + "/out.bin", out);
    write_file(dir + "/out_h.bin", out_h);
    write_file(dir + "/own.bin", own);
    write_file(dir + "/lse.bin", lse);
    return 0;
}
