// Run gemv_split.cu's kernels on the SIMT emulator. Commands (files in DIR):
//   gemv CODES SD T R DIR N_ROWS N_COLS N_TOK ROW_BYTES SCALE_COLS GR GC GLOBAL
//       reads codes.bin scales.bin x.bin [bias.bin], writes y.bin
//   dequant CODES SD OUT(f32|f16) DIR N_SRC N_COLS ROW_BYTES SCALE_COLS GR GC GLOBAL N_OUT ROW_OFFSET
//       reads codes.bin scales.bin [ids.bin], writes y.bin
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define PADDOCK_ALL_VARIANTS
#include "gemv_split.cu"

#include "host_io.h"

typedef void (*GemvFn)(const u8*, i64, const u8*, int, int, int, float, int, int, const float*, int, float*,
                       const float*);
typedef void (*DqF32)(const u8*, i64, const u8*, int, int, int, float, int, const int*, int, int, int, float*);
typedef void (*DqF16)(const u8*, i64, const u8*, int, int, int, float, int, const int*, int, int, int, u16*);

static GemvFn pick_gemv(const std::string& codes, int sd, int t, int r) {
#define PICK_T(C, SD, T, R) \
    if (codes == #C && sd == SD && t == T && r == R) return gemv_split_##C##_s##SD##_t##T##_r##R;
#define PICK(C, SD) PICK_T(C, SD, 1, 4) PICK_T(C, SD, 1, 2) PICK_T(C, SD, 2, 4) PICK_T(C, SD, 4, 2) PICK_T(C, SD, 8, 2)
    PICK(e4m3, 0) PICK(e4m3, 1) PICK(e2m1, 2) PICK(e2m1, 3)
    exit(4);
}

static void pick_dequant(const std::string& codes, int sd, DqF32& f32, DqF16& f16) {
#define PICK_DQ(C, SD)                              \
    if (codes == #C && sd == SD) {                  \
        f32 = dequant_split_##C##_s##SD##_f32;      \
        f16 = dequant_split_##C##_s##SD##_f16;      \
        return;                                     \
    }
    PICK_DQ(e4m3, 0) PICK_DQ(e4m3, 1) PICK_DQ(e2m1, 2) PICK_DQ(e2m1, 3)
    exit(4);
}

int main(int argc, char** argv) {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "gemv" && argc == 15) {
        const std::string codes_kind = argv[2], dir = argv[6];
        const int sd = atoi(argv[3]), t = atoi(argv[4]), r = atoi(argv[5]);
        const int n_rows = atoi(argv[7]), n_cols = atoi(argv[8]), n_tok = atoi(argv[9]);
        const i64 row_bytes = atoll(argv[10]);
        const int scale_cols = atoi(argv[11]), gr = atoi(argv[12]), gc = atoi(argv[13]);
        const float global = (float)atof(argv[14]);
        auto codes = read_file<uint4>(dir + "/codes.bin", 1);
        auto scales = read_file<uint4>(dir + "/scales.bin", 1);
        auto x = read_file<float>(dir + "/x.bin");
        auto bias = read_file<float>(dir + "/bias.bin");
        std::vector<float> y((size_t)n_tok * n_rows, NAN);
        GemvFn fn = pick_gemv(codes_kind, sd, t, r);
        const unsigned grid = (unsigned)((n_rows + SPLIT_WARPS * r - 1) / (SPLIT_WARPS * r));
        launch({grid, 1, 1}, {32 * SPLIT_WARPS, 1, 1}, [&] {
            fn(reinterpret_cast<const u8*>(codes.data()), row_bytes, reinterpret_cast<const u8*>(scales.data()),
               scale_cols, gr, gc, global, n_rows, n_cols, x.data(), n_tok, y.data(),
               bias.empty() ? nullptr : bias.data());
        });
        write_file(dir + "/y.bin", y);
        return 0;
    }
    if (cmd == "dequant" && argc == 15) {
        const std::string codes_kind = argv[2], out_kind = argv[4], dir = argv[5];
        const int sd = atoi(argv[3]), n_src = atoi(argv[6]), n_cols = atoi(argv[7]);
        const i64 row_bytes = atoll(argv[8]);
        const int scale_cols = atoi(argv[9]), gr = atoi(argv[10]), gc = atoi(argv[11]);
        const float global = (float)atof(argv[12]);
        const int n_out = atoi(argv[13]), row_offset = atoi(argv[14]);
        auto codes = read_file<uint4>(dir + "/codes.bin", 1);
        auto scales = read_file<uint4>(dir + "/scales.bin", 1);
        auto ids = read_file<int>(dir + "/ids.bin");
        DqF32 f32 = nullptr;
        DqF16 f16 = nullptr;
        pick_dequant(codes_kind, sd, f32, f16);
        const i64 work = (i64)n_out * (n_cols / 16);
        const unsigned grid = (unsigned)((work + 255) / 256);
        const u8* cp = reinterpret_cast<const u8*>(codes.data());
        const u8* sp = reinterpret_cast<const u8*>(scales.data());
        const int* ip = ids.empty() ? nullptr : ids.data();
        if (out_kind == "f32") {
            std::vector<float> y((size_t)n_out * n_cols, NAN);
            launch({grid, 1, 1}, {256, 1, 1}, [&] {
                f32(cp, row_bytes, sp, scale_cols, gr, gc, global, n_cols, ip, n_out, row_offset, n_src, y.data());
            });
            write_file(dir + "/y.bin", y);
        } else {
            std::vector<u16> y((size_t)n_out * n_cols, 0xffffu);
            launch({grid, 1, 1}, {256, 1, 1}, [&] {
                f16(cp, row_bytes, sp, scale_cols, gr, gc, global, n_cols, ip, n_out, row_offset, n_src, y.data());
            });
            write_file(dir + "/y.bin", y);
        }
        return 0;
    }
    return 2;
}
