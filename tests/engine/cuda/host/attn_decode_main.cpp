// Run attention_decode.cu's kernels on the SIMT emulator.
// argv: [rope] dir head_dim gmax n_seqs n_heads n_kv block_size table_stride scale softcap window n_blocks
//       and after `rope`, at the end: eps max_pos interleaved norm.
// Reads dir/{q,k,v,seq_lens,tables}.bin, writes dir/out.bin. With `rope` (attn_dec_rope_*, rope_cache's
// work fused in): qkv.bin for q.bin, also pos, cos, sin, slots and [qn, kn].bin, and writes the caches
// back as k_out.bin, v_out.bin. Built with -DKV_FP8=1: k.bin and v.bin are e4m3 codes with their block
// scales in ks.bin, vs.bin (no `rope`). Built with -DDEC_OUT_HALF=1: out.bin holds float16.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define PADDOCK_ALL_VARIANTS
#include "attention_decode.cu"
#if defined(DEC_OUT_HALF) && DEC_OUT_HALF
#define DEC_OUT_HALF_FILL u16(0xffffu)
#else
#define DEC_OUT_HALF_FILL NAN
#endif

#include "host_io.h"

#if DEC_FP8
typedef void (*DecFn)(const float*, const u8*, const u8*, const int*, const int*, int, int, int, int, float, float,
                      int, dec_out_t*, float*, float*, float*, int*, const int*, float*, const float*, const float*,
                      const float*);
#else
typedef void (*DecFn)(const float*, const u16*, const u16*, const int*, const int*, int, int, int, int, float, float,
                      int, dec_out_t*, float*, float*, float*, int*, const int*, float*, const float*);
#endif
typedef void (*RopeFn)(const float*, u16*, u16*, const int*, const int*, int, int, int, int, float, float, int,
                       dec_out_t*, float*, float*, float*, int*, const int*, float*, const float*, const float*,
                       const float*, float, const int*, const float*, const float*, int, int, int, const int*);

#define PICK_ALL(PICK)                                                   \
    PICK(64, 1) PICK(64, 2) PICK(64, 4) PICK(64, 8) PICK(64, 16)         \
    PICK(128, 1) PICK(128, 2) PICK(128, 4) PICK(128, 8)                  \
    PICK(256, 1) PICK(256, 2) PICK(256, 4) PICK(256, 8)

static DecFn pick(int d, int g) {
#define PICK(D, G) \
    if (d == D && g == G) return attn_dec_d##D##_g##G;
    PICK_ALL(PICK)
#undef PICK
    exit(4);
}

static RopeFn pick_rope(int d, int g) {
#if DEC_FP8
    exit(4);
#else
#define PICK(D, G) \
    if (d == D && g == G) return attn_dec_rope_d##D##_g##G;
    PICK_ALL(PICK)
#undef PICK
    exit(4);
#endif
}

int main(int argc, char** argv) {
    const bool rope = argc > 1 && strcmp(argv[1], "rope") == 0;
    if (argc != (rope ? 18 : 13)) return 2;
    char** a = argv + (rope ? 1 : 0);
    const std::string dir = a[1];
    const int d = atoi(a[2]), g = atoi(a[3]), n_seqs = atoi(a[4]), n_heads = atoi(a[5]);
    const int n_kv = atoi(a[6]), block_size = atoi(a[7]), stride = atoi(a[8]);
    const float scale = (float)atof(a[9]), softcap = (float)atof(a[10]);
    const int window = atoi(a[11]), blocks = atoi(a[12]);
    auto q = read_required<float>(dir + (rope ? "/qkv.bin" : "/q.bin"));
    auto k = read_required<dec_kv_t>(dir + "/k.bin");
    auto v = read_required<dec_kv_t>(dir + "/v.bin");
    auto ks = read_file<float>(dir + "/ks.bin");  // KV_FP8 builds: the block scales
    auto vs = read_file<float>(dir + "/vs.bin");
    auto seq_lens = read_required<int>(dir + "/seq_lens.bin");
    auto tables = read_required<int>(dir + "/tables.bin");
    auto sinks = read_file<float>(dir + "/sinks.bin");  // optional: the heads' sink logits
    // float32, or float16 codes with -DDEC_OUT_HALF=1 (0xffff: a float16 NaN, as NAN marks the unwritten)
    const dec_out_t unwritten = DEC_OUT_HALF_FILL;
    std::vector<dec_out_t> out((size_t)n_seqs * n_heads * d, unwritten);
    std::vector<float> acc((size_t)n_seqs * n_heads * blocks * d, NAN), m((size_t)n_seqs * n_heads * blocks, NAN),
        l((size_t)n_seqs * n_heads * blocks, NAN);
    std::vector<int> counters((size_t)n_seqs * n_kv, 0);
    std::vector<int> pos, slots;
    std::vector<float> cos_t, sin_t, qn, kn;
    float eps = 0.f;
    int max_pos = 0, interleaved = 0, norm = 0;
    if (rope) {
        eps = (float)atof(a[13]);
        max_pos = atoi(a[14]), interleaved = atoi(a[15]), norm = atoi(a[16]);
        pos = read_required<int>(dir + "/pos.bin");
        slots = read_required<int>(dir + "/slots.bin");
        cos_t = read_required<float>(dir + "/cos.bin");
        sin_t = read_required<float>(dir + "/sin.bin");
        qn = read_file<float>(dir + "/qn.bin");
        kn = read_file<float>(dir + "/kn.bin");
    }
    // Twice: the counters must be back at zero after a launch for the next one to merge (and with
    // `rope`, the second launch finds its own new keys already in the cache: same result).
    for (int round = 0; round < 2; ++round) {
        std::fill(out.begin(), out.end(), unwritten);
        launch({(unsigned)n_seqs, (unsigned)n_kv, (unsigned)blocks}, {128, 1, 1}, [&] {
            if (!rope) {
                pick(d, g)(q.data(), k.data(), v.data(), seq_lens.data(), tables.data(), stride, n_heads, n_kv,
                           block_size, scale, softcap, window, out.data(), acc.data(), m.data(), l.data(),
                           counters.data(), nullptr, nullptr, sinks.empty() ? nullptr : sinks.data()
#if DEC_FP8
                           , ks.data(), vs.data()
#endif
                );
                return;
            }
#if !DEC_FP8
            pick_rope(d, g)(q.data(), k.data(), v.data(), seq_lens.data(), tables.data(), stride, n_heads, n_kv,
                            block_size, scale, softcap, window, out.data(), acc.data(), m.data(), l.data(),
                            counters.data(), nullptr, nullptr, nullptr, norm ? qn.data() : nullptr, norm ? kn.data() : nullptr, eps, pos.data(),
                            cos_t.data(), sin_t.data(), max_pos, (int)(cos_t.size() / max_pos), interleaved,
                            slots.data());  // the tables' width: D / 2, or fewer for partial RoPE
#endif
        });
    }
    for (int c : counters)
        if (c != 0) return 5;
    write_file(dir + "/out.bin", out);
    if (rope) {
        write_file(dir + "/k_out.bin", k);
        write_file(dir + "/v_out.bin", v);
    }
    return 0;
}
