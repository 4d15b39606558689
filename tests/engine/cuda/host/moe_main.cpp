// Run moe.cu's whole pipeline on the SIMT emulator, in the order kernels/moe.py launches it:
//   moe FMT DIR N_TOK HIDDEN FF N_EXP K MODE NORMALIZE ACT ROW_BYTES_GU ROW_BYTES_DOWN SOFTCAP ROUTED_SCALE
//       N_GROUPS TOPK_GROUPS
// reads x.bin [T, H], logits.bin [T, E], gate.bin / up.bin ([E, FF] rows), down.bin ([E, H] rows),
// optional gate_bias.bin / up_bias.bin / down_bias.bin, score_bias.bin [E] (sigmoid routing) and
// expert_scale.bin [E] (Gemma 4: the chosen experts' weights times their scale, as kernels/moe.py's route_scaled);
// writes out.bin, chosen.bin, weights.bin (before the scale). ACT 2 (relu2) runs no gate product.
// FMT is one format for every projection, or "GATE_UP_FMT,DOWN_FMT" (Gemma 4's Q4_K gate/up beside a Q5_0 down).
#include <cmath>
#include <string>
#include <vector>

#define PADDOCK_ALL_VARIANTS
#include "moe.cu"

#include "host_io.h"

typedef void (*GroupedFn)(const u8*, i64, i64, int, int, const float*, int, const int*, const int*, int,
                          const float*, float*);

static GroupedFn pick(const std::string& fmt) {
#define PICK_MOE(SUFFIX, FMT) \
    if (fmt == #SUFFIX) return moe_grouped_##SUFFIX;
    PADDOCK_FORMATS(PICK_MOE)
    exit(4);
}

static const float* opt(const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); }

int main(int argc, char** argv) {
    if (argc != 18 || std::string(argv[1]) != "moe") return 2;
    const std::string fmt_arg = argv[2], dir = argv[3];
    const size_t comma = fmt_arg.find(',');
    const std::string fmt = fmt_arg.substr(0, comma);
    const std::string fmt_down = comma == std::string::npos ? fmt : fmt_arg.substr(comma + 1);
    const int T = atoi(argv[4]), H = atoi(argv[5]), FF = atoi(argv[6]), E = atoi(argv[7]), K = atoi(argv[8]);
    const int mode = atoi(argv[9]), normalize = atoi(argv[10]), act = atoi(argv[11]);
    const i64 rb_gu = atoll(argv[12]), rb_d = atoll(argv[13]);
    const float softcap = (float)atof(argv[14]), routed_scale = (float)atof(argv[15]);
    const int n_groups = atoi(argv[16]), topk_groups = atoi(argv[17]);
    auto score_bias = read_file<float>(dir + "/score_bias.bin");
    auto expert_scale = read_file<float>(dir + "/expert_scale.bin");
    auto x = read_required<float>(dir + "/x.bin");
    auto logits = read_required<float>(dir + "/logits.bin");
    auto gate = read_file<uint4>(dir + "/gate.bin", 2), up = read_file<uint4>(dir + "/up.bin", 2);
    auto down = read_file<uint4>(dir + "/down.bin", 2);
    auto gate_bias = read_file<float>(dir + "/gate_bias.bin"), up_bias = read_file<float>(dir + "/up_bias.bin");
    auto down_bias = read_file<float>(dir + "/down_bias.bin");
    const int P = T * K;
    std::vector<int> chosen(P), counts(E, 0), offsets(E + 1), cursor(E), order(P), where(P);
    std::vector<float> weights(P), g((size_t)P * FF), u((size_t)P * FF), a((size_t)P * FF), h((size_t)P * H),
        out((size_t)T * H, NAN);
    const unsigned threads = 64;
    auto blocks = [&](long n) { return dim3{(unsigned)((n + threads - 1) / threads), 1, 1}; };
    launch(blocks(T), {threads, 1, 1}, [&] {
        moe_route(logits.data(), T, E, K, mode, normalize, opt(score_bias), softcap, routed_scale, n_groups,
                  topk_groups, chosen.data(), weights.data());
    });
    launch(blocks(P), {threads, 1, 1}, [&] { moe_count(chosen.data(), P, counts.data()); });
    launch({1, 1, 1}, {1, 1, 1}, [&] { moe_offsets(counts.data(), E, offsets.data(), cursor.data()); });
    launch(blocks(P), {threads, 1, 1}, [&] { moe_scatter(chosen.data(), P, cursor.data(), order.data(), where.data()); });
    std::vector<float> scaled = weights;
    if (!expert_scale.empty())
        for (int q = 0; q < P; ++q) scaled[q] *= expert_scale[chosen[q]];
    const unsigned warps = 2;
    auto grouped = [&](const std::vector<uint4>& w, i64 rb, int rows, int cols, const float* in, int per_pair,
                       const std::vector<float>& bias, float* y, GroupedFn fn) {
        launch({(unsigned)((rows + warps - 1) / warps), (unsigned)E, 1}, {32 * warps, 1, 1}, [&] {
            fn(reinterpret_cast<const u8*>(w.data()), rb * rows, rb, rows, cols, in, per_pair, order.data(),
               offsets.data(), K, opt(bias), y);
        });
    };
    if (act != 2) grouped(gate, rb_gu, FF, H, x.data(), 0, gate_bias, g.data(), pick(fmt));
    grouped(up, rb_gu, FF, H, x.data(), 0, up_bias, u.data(), pick(fmt));
    launch(blocks((long)P * FF), {threads, 1, 1}, [&] {
        moe_gated(g.data(), u.data(), (i64)P * FF, act, 7.0f, 1.702f, a.data());
    });
    grouped(down, rb_d, H, FF, a.data(), 1, down_bias, h.data(), pick(fmt_down));
    launch({(unsigned)T, 1, 1}, {32, 1, 1}, [&] {
        moe_combine(h.data(), chosen.data(), scaled.data(), where.data(), K, H, out.data());
    });
    write_file(dir + "/out.bin", out);
    write_file(dir + "/chosen.bin", chosen);
    write_file(dir + "/weights.bin", weights);
    return 0;
}
