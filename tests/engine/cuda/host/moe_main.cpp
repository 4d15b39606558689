// Run moe.cu's kernels on the SIMT emulator, in the order and with the grids kernels/moe.py uses:
//   moe FMT DIR N_TOK HIDDEN FF N_EXP K MODE NORMALIZE ACT ROW_BYTES_GU ROW_BYTES_DOWN SOFTCAP ROUTED_SCALE
//       N_GROUPS TOPK_GROUPS [MANY_PAIRS SEPARATE FUSED_ROUTE [FUSED_DECODE [INT_X]]]
//     the whole pipeline: reads x.bin [T, H], logits.bin [T, E], gate.bin / up.bin ([E, FF] rows), down.bin
//     ([E, H] rows), optional gate_bias.bin / up_bias.bin / down_bias.bin and score_bias.bin [E] (sigmoid
//     routing), optional expert_scale.bin [E] (Gemma 4: each expert's output factor, applied in the combine),
//     and optional groups.bin [T, K] (int32: the slot each pair reads; N_EXP: skipped, as
//     backend/cuda/experts.py streams experts; without it a pair reads its expert); writes out.bin,
//     chosen.bin, weights.bin (before the scale). FMT is one format for every projection, or "GATE_UP_FMT,DOWN_FMT"
//     (Gemma 4's Q4_K gate/up beside a Q5_0 down). ACT 2 (relu2) runs no gate product. MANY_PAIRS 1: the grouping of many
//     pairs (moe_count, moe_offsets, moe_scatter) instead of moe_offsets alone; SEPARATE 1: gate and up
//     as two grouped products and moe_gated (their formats differ) instead of the fused one; FUSED_ROUTE 1:
//     moe_route_grouped (route and group in one block) instead of moe_route then the grouping; FUSED_DECODE 1:
//     kernels/moe.py's path for a few tokens: moe_route, the gate/up product per pair (moe_pair_gated_<fmt>,
//     or moe_pair_<fmt> for relu2) and moe_down_combine_<fmt> (down product and combine in one launch; with
//     shared.bin [T, H] and shared_logit.bin [T], a shared expert's rows joined times sigmoid of the logit). INT_X 1:
//     the grouped products' inputs quantized by moe_xq and multiplied by moe_grouped[_gated]_int_<fmt>.
//   route DIR N_TOK N_EXP K MODE NORMALIZE SOFTCAP ROUTED_SCALE N_GROUPS TOPK_GROUPS [LOGIT_STRIDE]
//     moe_route alone: logits.bin ([N_TOK, LOGIT_STRIDE], default N_EXP; and score_bias.bin) -> chosen.bin,
//     weights.bin.
#include <cmath>
#include <string>
#include <vector>

#define PADDOCK_ALL_VARIANTS
#include "moe.cu"

#include "host_io.h"

typedef void (*GroupedFn)(const u8*, i64, i64, int, int, const float*, int, const int*, const int*, const int*, int,
                          const float*, int, float*);
typedef void (*GatedFn)(const u8*, const u8*, i64, i64, int, int, const float*, const int*, const int*, const int*,
                        int, const float*, const float*, int, float, float, float*);
typedef void (*PairFn)(const u8*, i64, i64, int, int, const float*, const int*, int, const float*, int, float*);
typedef void (*PairGatedFn)(const u8*, const u8*, i64, i64, int, int, const float*, const int*, int, const float*,
                            const float*, int, float, float, float*);
typedef void (*GroupedIntFn)(const u8*, i64, i64, int, int, const u16*, const float2*, int, const int*, const int*,
                             const int*, int, const float*, int, float*);
typedef void (*GatedIntFn)(const u8*, const u8*, i64, i64, int, int, const u16*, const float2*, const int*,
                           const int*, const int*, int, const float*, const float*, int, float, float, float*);
typedef void (*DownCombineFn)(const u8*, i64, i64, int, int, const float*, const int*, const float*, const float*, int,
                              const float*, const float*, const float*, i64, float*);

// One format's kernels.
struct MoeFns {
    GroupedFn grouped;
    GatedFn gated;
    PairFn pair;
    PairGatedFn pair_gated;
    DownCombineFn down_combine;
    GroupedIntFn grouped_int;
    GatedIntFn gated_int;
};

static MoeFns pick(const std::string& fmt) {
#define PICK_MOE(SUFFIX, FMT)                                                                                 \
    if (fmt == #SUFFIX)                                                                                       \
        return {moe_grouped_##SUFFIX,      moe_grouped_gated_##SUFFIX,    moe_pair_##SUFFIX,               \
                moe_pair_gated_##SUFFIX,   moe_down_combine_##SUFFIX,     moe_grouped_int_##SUFFIX,        \
                moe_grouped_gated_int_##SUFFIX};
    PADDOCK_FORMATS(PICK_MOE)
    exit(4);
}

static const float* opt(const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); }

static const unsigned ROUTE_WARPS = 4, WARPS = 4, ROWS = 2, PLAN_THREADS = 1024, THREADS = 64;

static void route(const std::string& dir, int T, int E, int K, int mode, int normalize, float softcap,
                  float routed_scale, int n_groups, int topk_groups, std::vector<int>& chosen,
                  std::vector<float>& weights, int logit_stride) {
    auto score_bias = read_file<float>(dir + "/score_bias.bin");
    auto logits = read_required<float>(dir + "/logits.bin");
    chosen.assign((size_t)T * K, -1);
    weights.assign((size_t)T * K, NAN);
    launch({(T + ROUTE_WARPS - 1) / ROUTE_WARPS, 1, 1}, {32 * ROUTE_WARPS, 1, 1}, [&] {
        moe_route(logits.data(), T, E, K, mode, normalize, opt(score_bias), softcap, routed_scale, n_groups,
                  topk_groups, logit_stride, chosen.data(), weights.data());
    });
}

// kernels/moe.py's _product_grid: row blocks of WARPS warps, each 32 / width lane groups of ROWS rows.
static dim3 product_grid(int rows, int cols, int slots, int pairs) {
    int width = 32;
    while (width > 1 && 2 * width > cols / 32) width >>= 1;
    const unsigned per_block = WARPS * (32 / width) * ROWS;
    return {(rows + per_block - 1) / per_block, (unsigned)std::min(slots, pairs), 1};
}

int main(int argc, char** argv) {
    if ((argc == 12 || argc == 13) && std::string(argv[1]) == "route") {
        const std::string dir = argv[2];
        std::vector<int> chosen;
        std::vector<float> weights;
        const int stride = argc == 13 ? atoi(argv[12]) : atoi(argv[4]);  // LOGIT_STRIDE: rows wider than N_EXP
        route(dir, atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), atoi(argv[6]), atoi(argv[7]), (float)atof(argv[8]),
              (float)atof(argv[9]), atoi(argv[10]), atoi(argv[11]), chosen, weights, stride);
        write_file(dir + "/chosen.bin", chosen);
        write_file(dir + "/weights.bin", weights);
        return 0;
    }
    if ((argc != 18 && argc != 21 && argc != 22 && argc != 23) || std::string(argv[1]) != "moe") return 2;
    const std::string fmt_arg = argv[2], dir = argv[3];
    const size_t comma = fmt_arg.find(',');
    const std::string fmt = fmt_arg.substr(0, comma);
    const std::string fmt_down = comma == std::string::npos ? fmt : fmt_arg.substr(comma + 1);
    const int T = atoi(argv[4]), H = atoi(argv[5]), FF = atoi(argv[6]), E = atoi(argv[7]), K = atoi(argv[8]);
    const int mode = atoi(argv[9]), normalize = atoi(argv[10]), act = atoi(argv[11]);
    const i64 rb_gu = atoll(argv[12]), rb_d = atoll(argv[13]);
    const float softcap = (float)atof(argv[14]), routed_scale = (float)atof(argv[15]);
    const int n_groups = atoi(argv[16]), topk_groups = atoi(argv[17]);
    const bool many = argc >= 21 && atoi(argv[18]), separate = argc >= 21 && atoi(argv[19]);
    const bool fused_route = argc >= 21 && atoi(argv[20]), fused_decode = argc >= 22 && atoi(argv[21]);
    const bool int_x = argc == 23 && atoi(argv[22]);
    auto x = read_required<float>(dir + "/x.bin");
    auto gate = read_file<uint4>(dir + "/gate.bin", 2), up = read_file<uint4>(dir + "/up.bin", 2);
    auto down = read_file<uint4>(dir + "/down.bin", 2);
    auto gate_bias = read_file<float>(dir + "/gate_bias.bin"), up_bias = read_file<float>(dir + "/up_bias.bin");
    auto down_bias = read_file<float>(dir + "/down_bias.bin");
    auto slot_of = read_file<int>(dir + "/groups.bin");
    auto expert_scale = read_file<float>(dir + "/expert_scale.bin");
    const int P = T * K;
    std::vector<int> chosen((size_t)P, -1);
    std::vector<float> weights((size_t)P, NAN);
    const bool skipping = !slot_of.empty();
    const int G = skipping ? E + 1 : E;  // the extra group: the skipped pairs
    std::vector<int> counts(G, 0), offsets(G + 1, -1), cursor(G, -1), active(1 + E, -1), order(P, -1), where(P, -1);
    if (fused_route) {
        auto score_bias = read_file<float>(dir + "/score_bias.bin");
        auto logits = read_required<float>(dir + "/logits.bin");
        launch({1, 1, 1}, {PLAN_THREADS, 1, 1}, [&] {
            moe_route_grouped(logits.data(), T, E, K, mode, normalize, opt(score_bias), softcap, routed_scale,
                              n_groups, topk_groups, E, chosen.data(), weights.data(), offsets.data(), active.data(),
                              order.data(), where.data());
        });
    } else {
        route(dir, T, E, K, mode, normalize, softcap, routed_scale, n_groups, topk_groups, chosen, weights, E);
    }
    const int* groups = skipping ? slot_of.data() : chosen.data();
    const MoeFns fns = pick(fmt), down_fns = pick(fmt_down);
    if (fused_decode) {  // kernels/moe.py's moe_few_tokens, after moe_route
        if (skipping || many || separate || fused_route) return 3;
        std::vector<float> a((size_t)P * FF, NAN), out((size_t)T * H, NAN);
        const dim3 block{32 * WARPS, 1, 1};
        dim3 grid = product_grid(FF, H, P, P);  // y: one pair a block row
        if (act == 2) {
            launch(grid, block, [&] {
                fns.pair(reinterpret_cast<const u8*>(up.data()), rb_gu * FF, rb_gu, FF, H, x.data(), chosen.data(), K,
                         opt(up_bias), 2, a.data());
            });
        } else {
            launch(grid, block, [&] {
                fns.pair_gated(reinterpret_cast<const u8*>(gate.data()), reinterpret_cast<const u8*>(up.data()),
                               rb_gu * FF, rb_gu, FF, H, x.data(), chosen.data(), K, opt(gate_bias), opt(up_bias), act,
                               7.0f, 1.702f, a.data());
            });
        }
        int width = 32;
        while (width > 1 && 2 * width > FF / 32) width >>= 1;
        const unsigned per_warp = 32 / width, row_groups = (H + ROWS - 1) / ROWS;
        auto shared = read_file<float>(dir + "/shared.bin");  // optional: a shared expert's rows, joined gated
        auto shared_logit = read_file<float>(dir + "/shared_logit.bin");
        launch({(row_groups + per_warp - 1) / per_warp, (unsigned)T, 1}, {32 * (unsigned)K, 1, 1}, [&] {
            down_fns.down_combine(reinterpret_cast<const u8*>(down.data()), rb_d * H, rb_d, H, FF, a.data(),
                                  chosen.data(), weights.data(), opt(expert_scale), K, opt(down_bias), opt(shared),
                                  opt(shared_logit), 1, out.data());
        });
        write_file(dir + "/out.bin", out);
        write_file(dir + "/chosen.bin", chosen);
        write_file(dir + "/weights.bin", weights);
        return 0;
    }
    if (fused_route) {
        if (skipping || many) return 3;  // moe_route_grouped groups by expert, in one block
    } else if (many) {
        launch({(unsigned)((P + THREADS - 1) / THREADS), 1, 1}, {THREADS, 1, 1},
               [&] { moe_count(groups, P, counts.data()); });
        launch({1, 1, 1}, {PLAN_THREADS, 1, 1}, [&] {
            moe_offsets(groups, P, counts.data(), G, E, offsets.data(), cursor.data(), active.data(), nullptr, nullptr);
        });
        launch({(unsigned)((P + THREADS - 1) / THREADS), 1, 1}, {THREADS, 1, 1},
               [&] { moe_scatter(groups, P, cursor.data(), order.data(), where.data()); });
    } else {
        launch({1, 1, 1}, {PLAN_THREADS, 1, 1}, [&] {
            moe_offsets(groups, P, nullptr, G, E, offsets.data(), nullptr, active.data(), order.data(), where.data());
        });
    }

    const float unwritten = skipping ? 0.f : NAN;  // moe.py zeroes the products' outputs only when skipping
    std::vector<float> a((size_t)P * FF, unwritten), h((size_t)P * H, unwritten), out((size_t)T * H, NAN);
    const dim3 block{32 * WARPS, 1, 1};
    // kernels/moe.py's quantize_rows: n rows of `cols` floats as moe_xq's codes and (scale, sum) per 16 columns
    std::vector<u16> codes;
    std::vector<float2> ds;
    auto quantize = [&](const float* in, int n, int cols) {
        codes.assign((size_t)n * cols, 0);
        ds.assign((size_t)n * cols / 16, float2{NAN, NAN});
        const int groups = n * cols / 16;
        launch({(unsigned)((groups + THREADS - 1) / THREADS), 1, 1}, {THREADS, 1, 1},
               [&] { moe_xq(in, n, cols, codes.data(), ds.data()); });
    };
    auto grouped = [&](const std::vector<uint4>& w, i64 rb, int rows, int cols, const float* in, int per_pair,
                       const std::vector<float>& bias, int kind, float* y, const MoeFns& f) {
        const u8* wp = reinterpret_cast<const u8*>(w.data());
        if (int_x) {
            quantize(in, per_pair ? P : T, cols);
            launch(product_grid(rows, cols, E, P), block, [&] {
                f.grouped_int(wp, rb * rows, rb, rows, cols, codes.data(), ds.data(), per_pair, order.data(),
                              offsets.data(), active.data(), K, opt(bias), kind, y);
            });
            return;
        }
        launch(product_grid(rows, cols, E, P), block, [&] {
            f.grouped(wp, rb * rows, rb, rows, cols, in, per_pair, order.data(), offsets.data(), active.data(), K,
                      opt(bias), kind, y);
        });
    };
    if (act == 2) {
        grouped(up, rb_gu, FF, H, x.data(), 0, up_bias, 2, a.data(), fns);
    } else if (separate) {
        std::vector<float> g((size_t)P * FF, unwritten), u((size_t)P * FF, unwritten);
        grouped(gate, rb_gu, FF, H, x.data(), 0, gate_bias, -1, g.data(), fns);
        grouped(up, rb_gu, FF, H, x.data(), 0, up_bias, -1, u.data(), fns);
        launch({(unsigned)(((long)P * FF + THREADS - 1) / THREADS), 1, 1}, {THREADS, 1, 1},
               [&] { moe_gated(g.data(), u.data(), (i64)P * FF, act, 7.0f, 1.702f, a.data()); });
    } else if (int_x) {
        quantize(x.data(), T, H);
        launch(product_grid(FF, H, E, P), block, [&] {
            fns.gated_int(reinterpret_cast<const u8*>(gate.data()), reinterpret_cast<const u8*>(up.data()),
                          rb_gu * FF, rb_gu, FF, H, codes.data(), ds.data(), order.data(), offsets.data(),
                          active.data(), K, opt(gate_bias), opt(up_bias), act, 7.0f, 1.702f, a.data());
        });
    } else {
        launch(product_grid(FF, H, E, P), block, [&] {
            fns.gated(reinterpret_cast<const u8*>(gate.data()), reinterpret_cast<const u8*>(up.data()), rb_gu * FF,
                      rb_gu, FF, H, x.data(), order.data(), offsets.data(), active.data(), K, opt(gate_bias),
                      opt(up_bias), act, 7.0f, 1.702f, a.data());
        });
    }
    grouped(down, rb_d, H, FF, a.data(), 1, down_bias, -1, h.data(), down_fns);
    launch({(unsigned)T, 1, 1}, {32, 1, 1}, [&] {
        moe_combine(h.data(), chosen.data(), weights.data(), opt(expert_scale), where.data(), K, H, out.data());
    });
    write_file(dir + "/out.bin", out);
    write_file(dir + "/chosen.bin", chosen);
    write_file(dir + "/weights.bin", weights);
    return 0;
}
