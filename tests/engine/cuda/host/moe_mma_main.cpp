// Run moe_mma.cu (the routed experts' grouped products on tensor cores) on the SIMT emulator, as
// kernels/moe_mma.py launches it: the inputs as scaled float16 rows, the tile list, then the product over
// the grid's upper bound.
//   moe_mma FMT DIR N_EXP N_ROWS N_COLS ROW_BYTES K PER_PAIR N_PAIRS
// reads w.bin (stacked [N_EXP, N_ROWS] rows), x.bin (float32 inputs: [tokens, N_COLS], or [N_PAIRS,
// N_COLS] per pair), order.bin and offsets.bin (int32, moe_scatter's and moe_offsets'), optional
// bias.bin ([N_EXP, N_ROWS]); writes y.bin (float32 [N_PAIRS, N_ROWS], NaN where never written) and
// tiles.bin (the tile list).
#include <cmath>
#include <string>
#include <vector>

#define PADDOCK_ALL_VARIANTS
#include "moe_mma.cu"

#include "host_io.h"

typedef void (*MmaFn)(const u8*, i64, i64, int, int, const u16*, const float*, int, const int*, const int*,
                      const int*, int, const float*, float*);

static MmaFn pick(const std::string& fmt) {
#define PICK_MMA(SUFFIX, FMT) \
    if (fmt == #SUFFIX) return moe_mma_##SUFFIX;
    MOE_MMA_FORMATS(PICK_MMA)
    exit(4);
}

int main(int argc, char** argv) {
    if (argc != 11 || std::string(argv[1]) != "moe_mma") return 2;
    const std::string fmt = argv[2], dir = argv[3];
    const int n_exp = atoi(argv[4]), n_rows = atoi(argv[5]), n_cols = atoi(argv[6]);
    const i64 row_bytes = atoll(argv[7]);
    const int k = atoi(argv[8]), per_pair = atoi(argv[9]), n_pairs = atoi(argv[10]);
    auto w = read_file<uint4>(dir + "/w.bin", 2);
    auto x = read_required<float>(dir + "/x.bin");
    auto order = read_required<int>(dir + "/order.bin");
    auto offsets = read_required<int>(dir + "/offsets.bin");
    auto bias = read_file<float>(dir + "/bias.bin");
    const int max_tiles = (n_pairs + MMA_BM - 1) / MMA_BM + n_exp;
    std::vector<int> tiles(1 + 2 * max_tiles, -1);
    std::vector<float> y((size_t)n_pairs * n_rows, NAN);
    MmaFn fn = pick(fmt);
    const int x_rows = (int)(x.size() / n_cols);
    std::vector<u16> x16(x.size());
    std::vector<float> inv_scale(x_rows, NAN);
    launch({(unsigned)((x_rows + 1) / 2), 1, 1}, {64, 1, 1}, [&] {  // two warps, a row each
        moe_mma_half(x.data(), x_rows, n_cols, x16.data(), inv_scale.data());
    });
    launch({1, 1, 1}, {64, 1, 1}, [&] { moe_mma_tiles(offsets.data(), n_exp, tiles.data()); });
    launch({(unsigned)((n_rows + MMA_BN - 1) / MMA_BN), (unsigned)max_tiles, 1}, {MMA_THREADS, 1, 1}, [&] {
        fn(reinterpret_cast<const u8*>(w.data()), row_bytes * n_rows, row_bytes, n_rows, n_cols, x16.data(),
           inv_scale.data(), per_pair, order.data(), offsets.data(), tiles.data(), k,
           bias.empty() ? nullptr : bias.data(), y.data());
    });
    write_file(dir + "/y.bin", y);
    write_file(dir + "/tiles.bin", tiles);
    return 0;
}
