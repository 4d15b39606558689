// Run gemv.cu and norm.cu kernels on the SIMT emulator. Commands (files in DIR):
//   gemv FMT BUCKET ROWS WARPS DIR N_ROWS N_COLS N_TOK ROW_BYTES   reads w.bin x.bin [bias.bin], writes y.bin
//   add_rms_norm DIR ROWS COLS EPS THREADS [vec|half|half_noadd]   reads x.bin res.bin w.bin, writes y.bin newres.bin
//       (half: float16 y from the *_vec_h kernels; half_noadd: rms_norm_vec_h of x alone)
//   rms_norm_join DIR ROWS COLS EPS THREADS [scale]   reads x.bin join.bin w.bin [scale.bin], writes y.bin
//   rms_norm_heads DIR TOKENS WIDTH START HEADS N_COLS EPS THREADS   reads x.bin w.bin, writes y.bin (x, normed in place)
//   rms_norm_pair DIR ROWS COLS EPS THREADS   reads x.bin w.bin w2.bin, writes y.bin y2.bin
//   dequant FMT OUT(f32|f16) DIR N_SRC N_COLS ROW_BYTES N_OUT ROW_OFFSET   reads w.bin [ids.bin], writes y.bin
//   output_gate KIND(sigmoid|softplus) DIR N_TOK WIDTH GATE_STRIDE PER   reads out.bin gate.bin, writes y.bin
//   gated_pairs KIND(silu|gelu_tanh) OUT(f32|f16) DIR N_TOK F VEC   reads gu.bin ([N_TOK, 2F]), writes y.bin
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define PADDOCK_ALL_VARIANTS
#include "activation.cu"
#include "dequant.cu"
#include "gemv.cu"
#include "norm.cu"

#include "host_io.h"

typedef void (*GemvFn)(const u8*, i64, int, int, const float*, int, float*, const float*);

static GemvFn pick_gemv(const std::string& fmt, int bucket, int rows) {
#define PICK_T(SUFFIX, T, R) \
    if (fmt == #SUFFIX && bucket == T && rows == R) return gemv_##SUFFIX##_t##T##_r##R;
#define PICK(SUFFIX, FMT) PICK_T(SUFFIX, 1, 8) PICK_T(SUFFIX, 1, 4) PICK_T(SUFFIX, 1, 1) PICK_T(SUFFIX, 2, 4) PICK_T(SUFFIX, 4, 2) PICK_T(SUFFIX, 8, 2)
    PADDOCK_FORMATS(PICK)
    exit(4);
}

typedef void (*DequantF32)(const u8*, i64, int, const int*, int, int, int, float*);
typedef void (*DequantF16)(const u8*, i64, int, const int*, int, int, int, u16*);

static void pick_dequant(const std::string& fmt, DequantF32& f32, DequantF16& f16) {
#define PICK_DQ(SUFFIX, FMT)                  \
    if (fmt == #SUFFIX) {                     \
        f32 = dequant_##SUFFIX##_f32;         \
        f16 = dequant_##SUFFIX##_f16;         \
        return;                               \
    }
    PADDOCK_FORMATS(PICK_DQ)
    exit(4);
}

int main(int argc, char** argv) {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "gemv" && argc == 11) {
        const std::string fmt = argv[2], dir = argv[6];
        const int bucket = atoi(argv[3]), rows_per_block = atoi(argv[4]), warps = atoi(argv[5]);
        const int n_rows = atoi(argv[7]), n_cols = atoi(argv[8]), n_tok = atoi(argv[9]);
        const i64 row_bytes = atoll(argv[10]);
        auto w = read_file<uint4>(dir + "/w.bin", 2);  // 16-byte aligned and padded, as on the GPU
        auto x = read_file<float>(dir + "/x.bin");
        auto bias = read_file<float>(dir + "/bias.bin");
        std::vector<float> y((size_t)n_tok * n_rows, NAN);
        GemvFn fn = pick_gemv(fmt, bucket, rows_per_block);
        launch({(unsigned)((n_rows + rows_per_block - 1) / rows_per_block), 1, 1}, {(unsigned)(32 * warps), 1, 1}, [&] {
            fn(reinterpret_cast<const u8*>(w.data()), row_bytes, n_rows, n_cols, x.data(), n_tok, y.data(),
               bias.empty() ? nullptr : bias.data());
        });
        write_file(dir + "/y.bin", y);
        return 0;
    }
    if (cmd == "add_rms_norm" && (argc == 7 || argc == 8)) {
        const std::string mode = argc == 8 ? argv[7] : "";  // "", vec, half (float16 out), half_noadd (x alone)
        const bool vec = mode == "vec", half = mode.rfind("half", 0) == 0;
        const std::string dir = argv[2];
        const int rows = atoi(argv[3]), cols = atoi(argv[4]), threads = atoi(argv[6]);
        const float eps = (float)atof(argv[5]);
        auto x = read_file<float>(dir + "/x.bin");
        auto res = read_file<float>(dir + "/res.bin");
        auto w = read_file<float>(dir + "/w.bin");
        std::vector<float> y((size_t)rows * cols, NAN), newres((size_t)rows * cols, NAN);
        std::vector<u16> y16((size_t)rows * cols, 0xffffu);
        launch({(unsigned)rows, 1, 1}, {(unsigned)threads, 1, 1}, [&] {
            if (mode == "half") add_rms_norm_vec_h(x.data(), res.data(), w.data(), y16.data(), newres.data(), cols, eps);
            else if (half) rms_norm_vec_h(x.data(), w.data(), y16.data(), cols, eps);
            else if (vec) add_rms_norm_vec(x.data(), res.data(), w.data(), y.data(), newres.data(), cols, eps);
            else add_rms_norm(x.data(), res.data(), w.data(), y.data(), newres.data(), cols, eps);
        });
        if (half) write_file(dir + "/y.bin", y16);
        else write_file(dir + "/y.bin", y);
        write_file(dir + "/newres.bin", newres);
        return 0;
    }
    if (cmd == "rms_norm_join" && (argc == 7 || argc == 8)) {
        const std::string dir = argv[2];
        const int rows = atoi(argv[3]), cols = atoi(argv[4]), threads = atoi(argv[6]);
        const float eps = (float)atof(argv[5]);
        auto x = read_file<float>(dir + "/x.bin");
        auto join = read_file<float>(dir + "/join.bin");
        auto w = read_file<float>(dir + "/w.bin");
        auto scale = read_file<float>(dir + "/scale.bin");
        const float* scale_ptr = argc == 8 ? scale.data() : nullptr;
        std::vector<float> y((size_t)rows * cols, NAN);
        launch({(unsigned)rows, 1, 1}, {(unsigned)threads, 1, 1},
               [&] { rms_norm_join_vec(x.data(), w.data(), join.data(), scale_ptr, y.data(), cols, eps); });
        write_file(dir + "/y.bin", y);
        return 0;
    }
    if (cmd == "rms_norm_pair" && argc == 7) {
        const std::string dir = argv[2];
        const int rows = atoi(argv[3]), cols = atoi(argv[4]), threads = atoi(argv[6]);
        const float eps = (float)atof(argv[5]);
        auto x = read_file<float>(dir + "/x.bin");
        auto w = read_file<float>(dir + "/w.bin");
        auto w2 = read_file<float>(dir + "/w2.bin");
        std::vector<float> y((size_t)rows * cols, NAN), y2((size_t)rows * cols, NAN);
        launch({(unsigned)rows, 1, 1}, {(unsigned)threads, 1, 1},
               [&] { rms_norm_pair_vec(x.data(), w.data(), w2.data(), y.data(), y2.data(), cols, eps); });
        write_file(dir + "/y.bin", y);
        write_file(dir + "/y2.bin", y2);
        return 0;
    }
    if (cmd == "rms_norm_heads" && argc == 10) {
        const std::string dir = argv[2];
        const int tokens = atoi(argv[3]), width = atoi(argv[4]), start = atoi(argv[5]), heads = atoi(argv[6]);
        const int cols = atoi(argv[7]), threads = atoi(argv[9]);
        const float eps = (float)atof(argv[8]);
        auto x = read_file<float>(dir + "/x.bin");
        auto w = read_file<float>(dir + "/w.bin");
        launch({(unsigned)(tokens * heads), 1, 1}, {(unsigned)threads, 1, 1},
               [&] { rms_norm_heads_vec(x.data(), w.data(), cols, eps, heads, width, start); });
        write_file(dir + "/y.bin", x);
        return 0;
    }
    if (cmd == "dequant" && argc == 10) {
        const std::string fmt = argv[2], out_kind = argv[3], dir = argv[4];
        const int n_src = atoi(argv[5]), n_cols = atoi(argv[6]), n_out = atoi(argv[8]), row_offset = atoi(argv[9]);
        const i64 row_bytes = atoll(argv[7]);
        auto w = read_file<uint4>(dir + "/w.bin", 2);
        auto ids = read_file<int>(dir + "/ids.bin");
        DequantF32 f32 = nullptr;
        DequantF16 f16 = nullptr;
        pick_dequant(fmt, f32, f16);
        const i64 work = (i64)n_out * (n_cols / 32);
        const unsigned grid = (unsigned)((work + 255) / 256);
        const u8* wp = reinterpret_cast<const u8*>(w.data());
        const int* ip = ids.empty() ? nullptr : ids.data();
        if (out_kind == "f32") {
            std::vector<float> y((size_t)n_out * n_cols, NAN);
            launch({grid, 1, 1}, {256, 1, 1}, [&] { f32(wp, row_bytes, n_cols, ip, n_out, row_offset, n_src, y.data()); });
            write_file(dir + "/y.bin", y);
        } else {
            std::vector<u16> y((size_t)n_out * n_cols, 0xffffu);
            launch({grid, 1, 1}, {256, 1, 1}, [&] { f16(wp, row_bytes, n_cols, ip, n_out, row_offset, n_src, y.data()); });
            write_file(dir + "/y.bin", y);
        }
        return 0;
    }
    if (cmd == "output_gate" && argc == 8) {
        const std::string kind = argv[2], dir = argv[3];
        const int n_tok = atoi(argv[4]), width = atoi(argv[5]), per = atoi(argv[7]);
        const i64 gate_stride = atoll(argv[6]);
        auto out = read_file<float>(dir + "/out.bin");
        auto gate = read_file<float>(dir + "/gate.bin");
        const i64 n = (i64)n_tok * width;
        std::vector<float> y((size_t)n, NAN);
        launch({(unsigned)((n + 255) / 256), 1, 1}, {256, 1, 1}, [&] {
            if (kind == "sigmoid") output_gate_sigmoid(out.data(), gate.data(), y.data(), n, width, gate_stride, per);
            else output_gate_softplus(out.data(), gate.data(), y.data(), n, width, gate_stride, per);
        });
        write_file(dir + "/y.bin", y);
        return 0;
    }
    if (cmd == "gated_pairs" && argc == 8) {
        const std::string kind = argv[2], out = argv[3], dir = argv[4];
        const int n_tok = atoi(argv[5]), f = atoi(argv[6]), vec = atoi(argv[7]);
        auto gu = read_file<float>(dir + "/gu.bin");
        const i64 n = (i64)n_tok * f;
        std::vector<float> y((size_t)n, NAN);
        std::vector<u16> y16((size_t)n, 0xffffu);
        const bool silu = kind == "silu", half = out == "f16";
        const i64 threads = (n + vec - 1) / vec;  // the wrapper's grid (activation.gated_pairs)
        launch({(unsigned)((threads + 255) / 256), 1, 1}, {256, 1, 1}, [&] {
            if (half && silu) gated_pairs_silu_h(gu.data(), y16.data(), n, f, vec);
            else if (half) gated_pairs_gelu_tanh_h(gu.data(), y16.data(), n, f, vec);
            else if (silu) gated_pairs_silu(gu.data(), y.data(), n, f, vec);
            else gated_pairs_gelu_tanh(gu.data(), y.data(), n, f, vec);
        });
        if (half) write_file(dir + "/y.bin", y16);
        else write_file(dir + "/y.bin", y);
        return 0;
    }
    return 2;
}
