// Run ssd.cu's kernels on the SIMT emulator. Commands (files in DIR, float32 unless said):
//   scan DIR T H P G N XBC_W DT_W N_SEQS N_SLOTS
//       reads xbc.bin [T, XBC_W] (x, B, C side by side from column 0), dt.bin [T, DT_W] (raw dt in
//       columns 0..H), dt_bias.bin a.bin d.bin [H], state.bin [N_SLOTS, H, P, N], qsl.bin slots.bin
//       (int32), init.bin (bytes); writes y.bin [T, H, P] and state_out.bin
//   norm DIR T INNER G Y_W Z_W EPS THREADS
//       reads y.bin [T, Y_W] (columns 0..INNER), z.bin [T, Z_W] (likewise), w.bin [INNER]; writes out.bin
// Compiled with -DSSD_NJ / -DSSD_ROWS by the test for its d_state and head size.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ssd.cu"

#include "host_io.h"

int main(int argc, char** argv) {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "scan" && argc == 12) {
        const std::string dir = argv[2];
        const int t = atoi(argv[3]), h = atoi(argv[4]), p = atoi(argv[5]), g = atoi(argv[6]), n = atoi(argv[7]);
        const int xbc_w = atoi(argv[8]), dt_w = atoi(argv[9]), n_seqs = atoi(argv[10]);
        (void)argv[11];
        auto xbc = read_required<float>(dir + "/xbc.bin");
        auto dt = read_required<float>(dir + "/dt.bin");
        auto dt_bias = read_required<float>(dir + "/dt_bias.bin");
        auto a = read_required<float>(dir + "/a.bin");
        auto d = read_required<float>(dir + "/d.bin");
        auto state = read_required<float>(dir + "/state.bin");
        auto qsl = read_required<int>(dir + "/qsl.bin");
        auto slots = read_required<int>(dir + "/slots.bin");
        auto init = read_required<u8>(dir + "/init.bin");
        std::vector<float> y((size_t)t * h * p, NAN);
        const float* x = xbc.data();
        const float* b = x + (size_t)h * p;
        const float* c = b + (size_t)g * n;
        launch({(unsigned)n_seqs, (unsigned)h, (unsigned)((p + SSD_WARPS * SSD_ROWS - 1) / (SSD_WARPS * SSD_ROWS))},
               {SSD_WARPS * 32, 1, 1}, [&] {
                   ssd_scan(x, xbc_w, dt.data(), dt_w, dt_bias.data(), a.data(), d.data(), b, c, xbc_w,
                            state.data(), qsl.data(), slots.data(), init.data(), y.data(), h, p, g, n);
               });
        write_file(dir + "/y.bin", y);
        write_file(dir + "/state_out.bin", state);
        return 0;
    }
    if (cmd == "norm" && argc == 10) {
        const std::string dir = argv[2];
        const int t = atoi(argv[3]), inner = atoi(argv[4]), g = atoi(argv[5]), y_w = atoi(argv[6]), z_w = atoi(argv[7]);
        const float eps = (float)atof(argv[8]);
        const unsigned threads = (unsigned)atoi(argv[9]);
        auto y = read_required<float>(dir + "/y.bin");
        auto z = read_required<float>(dir + "/z.bin");
        auto w = read_required<float>(dir + "/w.bin");
        std::vector<float> out((size_t)t * inner, NAN);
        launch({(unsigned)t, (unsigned)g, 1}, {threads, 1, 1}, [&] {
            gated_group_rms_norm(y.data(), y_w, z.data(), z_w, w.data(), out.data(), inner, inner / g, eps);
        });
        write_file(dir + "/out.bin", out);
        return 0;
    }
    return 2;
}
