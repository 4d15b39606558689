// Run the hybrid models' recurrent kernels (causal_conv1d.cu, gated_delta.cu) on the SIMT emulator.
// Commands (files in DIR, raw little-endian arrays written by test_emulated_recurrent.py):
//   conv DIR N_TOK N_SEQS C K ACT DECODE THREADS
//       reads x.bin w.bin [bias.bin] state.bin qsl.bin slots.bin init.bin (u8); writes y.bin, state.bin
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "causal_conv1d.cu"

#include "host_io.h"

int main(int argc, char** argv) {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "conv" && argc == 10) {
        const std::string dir = argv[2];
        const int n_tok = atoi(argv[3]), n_seqs = atoi(argv[4]), c = atoi(argv[5]), k = atoi(argv[6]);
        const int act = atoi(argv[7]), decode = atoi(argv[8]), threads = atoi(argv[9]);
        auto x = read_required<float>(dir + "/x.bin");
        auto w = read_required<float>(dir + "/w.bin");
        auto bias = read_file<float>(dir + "/bias.bin");
        auto state = read_required<float>(dir + "/state.bin");
        auto qsl = read_required<int>(dir + "/qsl.bin");
        auto slots = read_required<int>(dir + "/slots.bin");
        auto init = read_required<u8>(dir + "/init.bin");
        std::vector<float> y((size_t)n_tok * c, NAN);
        const float* b = bias.empty() ? nullptr : bias.data();
        launch({(unsigned)((c + threads - 1) / threads), (unsigned)n_seqs, 1}, {(unsigned)threads, 1, 1}, [&] {
            if (decode)
                causal_conv1d_update(x.data(), c, w.data(), b, state.data(), slots.data(), init.data(), y.data(), c, k,
                                     act);
            else
                causal_conv1d_varlen(x.data(), c, w.data(), b, state.data(), qsl.data(), slots.data(), init.data(),
                                     y.data(), c, k, act);
        });
        write_file(dir + "/y.bin", y);
        write_file(dir + "/state.bin", state);
        return 0;
    }
    return 2;
}
