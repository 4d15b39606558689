// Run gemv_int.cuh's bodies (int16 x, dp2a) on the SIMT emulator. Commands (files in DIR):
//   single FMT R U WARPS GRID DIR N_ROWS N_COLS ROW_BYTES                reads w.bin x.bin [bias.bin], writes y.bin
//   multi CASE WARPS GRID DIR N_COLS ROWS0 ROWS1 ROWS2 RB0 RB1 RB2      reads w0..2.bin x.bin [bias.bin], writes y.bin
//   gated CASE WARPS GRID DIR N_ROWS N_COLS RBA RBB                     reads wa.bin wb.bin x.bin, writes y.bin
// GRID is the number of blocks: fewer than the row groups make each warp loop over several.
// With DIR/nw.bin present, x is first added to DIR/res.bin (when present) and RMS-normalized
// (eps 1e-6) in the kernel's prologue; the new residual goes to DIR/newres.bin.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gemv_int.cuh"

#include "host_io.h"

typedef void (*SingleFn)(const u8*, i64, int, int, const float*, float*, const float*, const XqNorm&, u8*);
typedef void (*MultiFn)(const u8*, const u8*, const u8*, i64, i64, i64, int, int, int, int, const float*, float*,
                        const float*, const XqNorm&, u8*);
typedef void (*GatedFn)(const u8*, const u8*, i64, i64, int, int, const float*, float*, const XqNorm&, u8*);

// The optional fused norm's inputs (see the header) and where its new residual goes.
struct NormFiles {
    std::vector<float> res, w, new_res;
    XqNorm load(const std::string& dir, size_t n_cols) {
        res = read_file<float>(dir + "/res.bin");
        w = read_file<float>(dir + "/nw.bin");
        new_res.assign(n_cols, NAN);
        return XqNorm{res.empty() ? nullptr : res.data(), w.empty() ? nullptr : w.data(), new_res.data(), 1e-6f};
    }
    void save(const std::string& dir) const {
        if (!w.empty()) write_file(dir + "/newres.bin", new_res);
    }
};

static SingleFn pick_single(const std::string& fmt, int rows, int units) {
#define PICK_R(SUFFIX, FMT, R, U) \
    if (fmt == #SUFFIX && rows == R && units == U) return xq_gemv_body<FMT, R, U>;
#define PICK(SUFFIX, FMT) PICK_R(SUFFIX, FMT, 1, 1) PICK_R(SUFFIX, FMT, 2, 2) PICK_R(SUFFIX, FMT, 4, 1) PICK_R(SUFFIX, FMT, 1, 2)
    PADDOCK_INT_FORMATS(PICK)
    exit(4);
}

// (case, rows per warp): the combinations tests/engine/cuda/test_emulated_kernels.py asks for.
static MultiFn pick_multi(int c) {
    if (c == 0) return xq_multi_body<FmtQ4_K, FmtQ4_K, FmtQ6_K, 2, 2>;
    if (c == 1) return xq_multi_body<FmtQ8_0, FmtQ5_1, FmtQ4_0, 1, 1>;
    exit(4);
}

static GatedFn pick_gated(int c) {
    if (c == 0) return xq_gated_body<FmtQ4_K, FmtQ4_K, 1, 2, 0>;
    if (c == 1) return xq_gated_body<FmtQ6_K, FmtQ5_K, 2, 1, 1>;
    exit(4);
}

static const u8* bytes(const std::vector<uint4>& v) { return reinterpret_cast<const u8*>(v.data()); }

int main(int argc, char** argv) {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "single" && argc == 11) {
        const std::string fmt = argv[2], dir = argv[7];
        const int rows = atoi(argv[3]), units = atoi(argv[4]), warps = atoi(argv[5]), grid = atoi(argv[6]);
        const int n_rows = atoi(argv[8]), n_cols = atoi(argv[9]);
        const i64 row_bytes = atoll(argv[10]);
        auto w = read_file<uint4>(dir + "/w.bin", 2);  // two words of padding, as the device buffers have
        auto x = read_required<float>(dir + "/x.bin");
        auto bias = read_file<float>(dir + "/bias.bin");
        std::vector<float> y(n_rows, NAN);
        std::vector<u8> smem(3 * xq_shared_bytes(n_cols));  // room for three layouts
        SingleFn fn = pick_single(fmt, rows, units);
        NormFiles norm;
        const XqNorm nrm = norm.load(dir, n_cols);
        launch({(unsigned)grid, 1, 1}, {(unsigned)(32 * warps), 1, 1}, [&] {
            fn(bytes(w), row_bytes, n_rows, n_cols, x.data(), y.data(), bias.empty() ? nullptr : bias.data(), nrm,
               smem.data());
        });
        write_file(dir + "/y.bin", y);
        norm.save(dir);
        return 0;
    }
    if (cmd == "multi" && argc == 13) {
        const int c = atoi(argv[2]), warps = atoi(argv[3]), grid = atoi(argv[4]);
        const std::string dir = argv[5];
        const int n_cols = atoi(argv[6]);
        const int rows[3] = {atoi(argv[7]), atoi(argv[8]), atoi(argv[9])};
        const i64 rb[3] = {atoll(argv[10]), atoll(argv[11]), atoll(argv[12])};
        std::vector<uint4> w[3];
        for (int i = 0; i < 3; ++i) w[i] = read_file<uint4>(dir + "/w" + std::to_string(i) + ".bin", 2);
        if (w[2].size() <= 2) w[2] = w[1];  // two weights: the empty third points anywhere valid
        auto x = read_required<float>(dir + "/x.bin");
        auto bias = read_file<float>(dir + "/bias.bin");
        std::vector<float> y(rows[0] + rows[1] + rows[2], NAN);
        std::vector<u8> smem(3 * xq_shared_bytes(n_cols));  // room for three layouts
        MultiFn fn = pick_multi(c);
        NormFiles norm;
        const XqNorm nrm = norm.load(dir, n_cols);
        launch({(unsigned)grid, 1, 1}, {(unsigned)(32 * warps), 1, 1}, [&] {
            fn(bytes(w[0]), bytes(w[1]), bytes(w[2]), rb[0], rb[1], rb[2], rows[0], rows[1], rows[2], n_cols,
               x.data(), y.data(), bias.empty() ? nullptr : bias.data(), nrm, smem.data());
        });
        write_file(dir + "/y.bin", y);
        norm.save(dir);
        return 0;
    }
    if (cmd == "gated" && argc == 11) {
        const int c = atoi(argv[2]), warps = atoi(argv[3]), grid = atoi(argv[4]);
        const std::string dir = argv[5];
        const int n_rows = atoi(argv[6]), n_cols = atoi(argv[7]);
        const i64 rba = atoll(argv[8]), rbb = atoll(argv[9]);
        (void)argv[10];
        auto wa = read_file<uint4>(dir + "/wa.bin", 2);
        auto wb = read_file<uint4>(dir + "/wb.bin", 2);
        auto x = read_required<float>(dir + "/x.bin");
        std::vector<float> y(n_rows, NAN);
        std::vector<u8> smem(3 * xq_shared_bytes(n_cols));  // room for three layouts
        GatedFn fn = pick_gated(c);
        NormFiles norm;
        const XqNorm nrm = norm.load(dir, n_cols);
        launch({(unsigned)grid, 1, 1}, {(unsigned)(32 * warps), 1, 1}, [&] {
            fn(bytes(wa), bytes(wb), rba, rbb, n_rows, n_cols, x.data(), y.data(), nrm, smem.data());
        });
        write_file(dir + "/y.bin", y);
        norm.save(dir);
        return 0;
    }
    return 2;
}
