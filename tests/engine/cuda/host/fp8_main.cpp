// Run fp8_kv.cuh's codec and kv_cache.cu's write_kv_fp8 on the SIMT emulator. Commands (files in DIR):
//   codec DIR      reads x.bin (float), amax.bin (float); writes enc.bin (e4m3 of each x), dec.bin (the
//                  256 codes decoded), half.bin (the 256 codes as float16 times 2^-8, through the
//                  four-code word path), scale.bin (e4m3_block_scale of each amax)
//   write DIR N_TOK N_KV HEAD_DIM BLOCK_SIZE   reads k.bin v.bin slots.bin kd.bin ks.bin vd.bin vs.bin,
//                  writes the caches back as kd_out.bin ks_out.bin vd_out.bin vs_out.bin
//   rope DIR N_TOK N_HEADS N_KV HEAD_DIM EPS MAX_POS INTERLEAVED NORM BLOCK_SIZE   rope_cache.cu's KV_FP8
//                  build into float32 rows, then write_kv_fp8 (as rope_cache.py runs them): reads qkv, pos,
//                  cos, sin, slots, [qn, kn] and the caches as `write`; writes q.bin and the caches
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define KV_FP8 1
#include "kv_cache.cu"
#include "rope_cache.cu"

#include "host_io.h"

int main(int argc, char** argv) {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "codec" && argc == 3) {
        const std::string dir = argv[2];
        auto x = read_required<float>(dir + "/x.bin");
        auto amax = read_required<float>(dir + "/amax.bin");
        std::vector<u8> enc(x.size());
        for (size_t i = 0; i < x.size(); ++i) enc[i] = e4m3_encode(x[i]);
        std::vector<float> dec(256), scale(amax.size());
        std::vector<u16> half(256);
        for (u32 c = 0; c < 256; ++c) dec[c] = e4m3_decode(c);
        for (u32 c = 0; c < 256; c += 4) {
            u32 lo, hi;
            e4m3x4_to_half2m8(c | (c + 1) << 8 | (c + 2) << 16 | (c + 3) << 24, lo, hi);
            half[c] = (u16)lo, half[c + 1] = (u16)(lo >> 16), half[c + 2] = (u16)hi, half[c + 3] = (u16)(hi >> 16);
        }
        for (size_t i = 0; i < amax.size(); ++i) scale[i] = e4m3_block_scale(amax[i]);
        write_file(dir + "/enc.bin", enc);
        write_file(dir + "/dec.bin", dec);
        write_file(dir + "/half.bin", half);
        write_file(dir + "/scale.bin", scale);
        return 0;
    }
    const bool rope = cmd == "rope" && argc == 12;
    if ((cmd == "write" && argc == 7) || rope) {
        const std::string dir = argv[2];
        const int n_tok = atoi(argv[3]);
        const int n_heads = rope ? atoi(argv[4]) : 0, o = rope ? 1 : 0;  // rope: N_HEADS comes before N_KV
        const int n_kv = atoi(argv[4 + o]), head_dim = atoi(argv[5 + o]), block_size = atoi(argv[rope ? 11 : 6]);
        std::vector<float> k, v;
        if (rope) {
            auto qkv = read_required<float>(dir + "/qkv.bin");
            auto pos = read_required<int>(dir + "/pos.bin");
            auto cos_t = read_required<float>(dir + "/cos.bin");
            auto sin_t = read_required<float>(dir + "/sin.bin");
            auto slots = read_required<int>(dir + "/slots.bin");
            auto qn = read_file<float>(dir + "/qn.bin");
            auto kn = read_file<float>(dir + "/kn.bin");
            const int norm = atoi(argv[10]);
            std::vector<float> q((size_t)n_tok * n_heads * head_dim, NAN);
            k.assign((size_t)n_tok * n_kv * head_dim, NAN);
            v.assign(k.size(), NAN);
            // rope_cache.py's launch: heads_per_block = max(1, 256 / (head_dim / 2)) heads a block
            const int hpb = std::max(1, 256 / (head_dim / 2)), n_rows = n_heads + 2 * n_kv;
            const unsigned blocks = (unsigned)((n_rows + hpb - 1) / hpb), threads = (unsigned)(hpb * head_dim / 2);
            launch({(unsigned)n_tok, blocks, 1}, {threads, 1, 1}, [&] {
                rope_cache(qkv.data(), n_heads, n_kv, head_dim, norm ? qn.data() : nullptr, norm ? kn.data() : nullptr,
                           (float)atof(argv[7]), pos.data(), cos_t.data(), sin_t.data(), atoi(argv[8]),
                           (int)(cos_t.size() / atoi(argv[8])), atoi(argv[9]), k.data(), v.data(), slots.data(),
                           q.data());  // the table's width: head_dim / 2, or fewer for partial RoPE
            });
            write_file(dir + "/q.bin", q);
        } else {
            k = read_required<float>(dir + "/k.bin");
            v = read_required<float>(dir + "/v.bin");
        }
        auto slots = read_required<int>(dir + "/slots.bin");
        auto kd = read_required<u8>(dir + "/kd.bin");
        auto ks = read_required<float>(dir + "/ks.bin");
        auto vd = read_required<u8>(dir + "/vd.bin");
        auto vs = read_required<float>(dir + "/vs.bin");
        launch({(unsigned)n_tok, (unsigned)n_kv, 1}, {KV_FP8_THREADS, 1, 1}, [&] {
            write_kv_fp8(k.data(), v.data(), kd.data(), ks.data(), vd.data(), vs.data(), slots.data(), n_tok, n_kv,
                         head_dim, block_size);
        });
        write_file(dir + "/kd_out.bin", kd);
        write_file(dir + "/ks_out.bin", ks);
        write_file(dir + "/vd_out.bin", vd);
        write_file(dir + "/vs_out.bin", vs);
        return 0;
    }
    return 2;
}
