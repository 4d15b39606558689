// Run the hybrid models' recurrent kernels (causal_conv1d.cu, gated_delta.cu) on the SIMT emulator.
// Commands (files in DIR, raw little-endian arrays written by test_emulated_recurrent.py):
//   conv DIR N_TOK N_SEQS C K ACT DECODE THREADS CHUNK   (CHUNK tokens a block; grid z covers N_TOK)
//       reads x.bin w.bin [bias.bin] state.bin qsl.bin slots.bin init.bin (u8); writes y.bin, state.bin
//   delta DIR N_TOK N_SEQS HK HV DV TILED MODE   (0 varlen, 1 decode, 2 chunked; head_k_dim is the build's GDN_DK)
//       reads mixed.bin ba.bin nega.bin dtb.bin state.bin qsl.bin slots.bin init.bin; writes o.bin, state.bin
//   gated_norm DIR N_TOK HEADS DIM Z_STRIDE EPS THREADS  reads x.bin z.bin w.bin; writes y.bin
//   delta_fused DIR N_SEQS HK HV DV TILED Z_STRIDE EPS K LAUNCHES   a decode step with the conv before it and the
//       gated norm after it fused in, LAUNCHES times from the same inputs: reads delta's decode inputs (mixed.bin:
//       the conv's input, rows X_STRIDE = its width) and z.bin normw.bin convw.bin convstate.bin; writes o.bin
//       (the raw output), y.bin, state.bin, convstate.bin, counters.bin
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "causal_conv1d.cu"
#include "gated_delta.cu"

#include "host_io.h"

int main(int argc, char** argv) {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "conv" && argc == 11) {
        const std::string dir = argv[2];
        const int n_tok = atoi(argv[3]), n_seqs = atoi(argv[4]), c = atoi(argv[5]), k = atoi(argv[6]);
        const int act = atoi(argv[7]), decode = atoi(argv[8]), threads = atoi(argv[9]), chunk = atoi(argv[10]);
        auto x = read_required<float>(dir + "/x.bin");
        auto w = read_required<float>(dir + "/w.bin");
        auto bias = read_file<float>(dir + "/bias.bin");
        auto state = read_required<float>(dir + "/state.bin");
        auto qsl = read_required<int>(dir + "/qsl.bin");
        auto slots = read_required<int>(dir + "/slots.bin");
        auto init = read_required<u8>(dir + "/init.bin");
        std::vector<float> y((size_t)n_tok * c, NAN);
        const float* b = bias.empty() ? nullptr : bias.data();
        const unsigned chunks = decode ? 1u : (unsigned)((n_tok + chunk - 1) / chunk);
        launch({(unsigned)((c + threads - 1) / threads), (unsigned)n_seqs, chunks}, {(unsigned)threads, 1, 1}, [&] {
            if (decode)
                causal_conv1d_update(x.data(), c, w.data(), b, state.data(), slots.data(), init.data(), y.data(), c, k,
                                     act);
            else
                causal_conv1d_varlen(x.data(), c, w.data(), b, state.data(), qsl.data(), slots.data(), init.data(),
                                     y.data(), c, k, act, chunk);
        });
        write_file(dir + "/y.bin", y);
        write_file(dir + "/state.bin", state);
        return 0;
    }
    if (cmd == "delta" && argc == 10) {
        const std::string dir = argv[2];
        const int n_tok = atoi(argv[3]), n_seqs = atoi(argv[4]), hk = atoi(argv[5]), hv = atoi(argv[6]);
        const int dv = atoi(argv[7]), tiled = atoi(argv[8]), mode = atoi(argv[9]);
        auto mixed = read_required<float>(dir + "/mixed.bin");
        auto ba = read_required<float>(dir + "/ba.bin");
        auto nega = read_required<float>(dir + "/nega.bin");
        auto dtb = read_required<float>(dir + "/dtb.bin");
        auto state = read_required<float>(dir + "/state.bin");
        auto qsl = read_required<int>(dir + "/qsl.bin");
        auto slots = read_required<int>(dir + "/slots.bin");
        auto init = read_required<u8>(dir + "/init.bin");
        std::vector<float> o((size_t)n_tok * hv * dv, NAN);
        const i64 ms = 2 * hk * GDN_DK + hv * dv, bs = 2 * hv;
        const float scale = 1.f / sqrtf((float)GDN_DK);
        launch({(unsigned)((dv + GDN_COLS - 1) / GDN_COLS), (unsigned)hv, (unsigned)n_seqs},
               {GDN_WARPS * 32, 1, 1}, [&] {
                   if (mode == 2)
                       gated_delta_chunked(mixed.data(), ms, ba.data(), bs, nega.data(), dtb.data(), state.data(),
                                           qsl.data(), slots.data(), init.data(), o.data(), hk, hv, dv, tiled, scale);
                   else if (mode == 1)
                       gated_delta_decode(mixed.data(), ms, ba.data(), bs, nega.data(), dtb.data(), state.data(),
                                          slots.data(), init.data(), o.data(), hk, hv, dv, tiled, scale);
                   else
                       gated_delta_varlen(mixed.data(), ms, ba.data(), bs, nega.data(), dtb.data(), state.data(),
                                          qsl.data(), slots.data(), init.data(), o.data(), hk, hv, dv, tiled, scale);
               });
        write_file(dir + "/o.bin", o);
        write_file(dir + "/state.bin", state);
        return 0;
    }
    if (cmd == "delta_fused" && argc == 12) {
        const std::string dir = argv[2];
        const int n_seqs = atoi(argv[3]), hk = atoi(argv[4]), hv = atoi(argv[5]), dv = atoi(argv[6]);
        const int tiled = atoi(argv[7]), conv_k = atoi(argv[10]), launches = atoi(argv[11]);
        const i64 z_stride = atoll(argv[8]);
        const float eps = (float)atof(argv[9]);
        auto mixed = read_required<float>(dir + "/mixed.bin");
        auto ba = read_required<float>(dir + "/ba.bin");
        auto nega = read_required<float>(dir + "/nega.bin");
        auto dtb = read_required<float>(dir + "/dtb.bin");
        auto slots = read_required<int>(dir + "/slots.bin");
        auto init = read_required<u8>(dir + "/init.bin");
        auto z = read_required<float>(dir + "/z.bin");
        auto normw = read_required<float>(dir + "/normw.bin");
        auto convw = read_required<float>(dir + "/convw.bin");
        std::vector<float> o((size_t)n_seqs * hv * dv, NAN), y((size_t)n_seqs * hv * dv, NAN), state, conv_state;
        std::vector<int> counters((size_t)n_seqs * hv, 0), conv_counters((size_t)n_seqs * hk, 0);
        const int channels = 2 * hk * GDN_DK + hv * dv;
        const i64 bs = 2 * hv;
        const float scale = 1.f / sqrtf((float)GDN_DK);
        for (int l = 0; l < launches; ++l) {  // each launch from the same states: the counters must be back at zero
            state = read_required<float>(dir + "/state.bin");
            conv_state = read_required<float>(dir + "/convstate.bin");
            launch({(unsigned)((dv + GDN_COLS - 1) / GDN_COLS), (unsigned)hv, (unsigned)n_seqs},
                   {GDN_WARPS * 32, 1, 1}, [&] {
                       gated_delta_decode_fused(mixed.data(), channels, ba.data(), bs, nega.data(), dtb.data(),
                                                state.data(), slots.data(), init.data(), o.data(), hk, hv, dv, tiled,
                                                scale, z.data(), z_stride, normw.data(), eps, counters.data(), y.data(),
                                                convw.data(), conv_state.data(), channels, conv_k,
                                                conv_counters.data());
                   });
        }
        counters.insert(counters.end(), conv_counters.begin(), conv_counters.end());
        write_file(dir + "/o.bin", o);
        write_file(dir + "/y.bin", y);
        write_file(dir + "/state.bin", state);
        write_file(dir + "/convstate.bin", conv_state);
        write_file(dir + "/counters.bin", counters);
        return 0;
    }
    if (cmd == "gated_norm" && argc == 9) {
        const std::string dir = argv[2];
        const int n_tok = atoi(argv[3]), heads = atoi(argv[4]), dim = atoi(argv[5]);
        const i64 z_stride = atoll(argv[6]);
        const float eps = (float)atof(argv[7]);
        const int threads = atoi(argv[8]);
        auto x = read_required<float>(dir + "/x.bin");
        auto z = read_required<float>(dir + "/z.bin");
        auto w = read_required<float>(dir + "/w.bin");
        std::vector<float> y((size_t)n_tok * heads * dim, NAN);
        launch({(unsigned)(n_tok * heads), 1, 1}, {(unsigned)threads, 1, 1},
               [&] { gated_rms_norm(x.data(), z.data(), z_stride, heads, w.data(), eps, y.data(), dim); });
        write_file(dir + "/y.bin", y);
        return 0;
    }
    return 2;
}
