// Run gemv.cu and norm.cu kernels on the SIMT emulator. Commands (files in DIR):
//   gemv FMT BUCKET WARPS DIR N_ROWS N_COLS N_TOK ROW_BYTES   reads w.bin x.bin [bias.bin], writes y.bin
//   add_rms_norm DIR ROWS COLS EPS THREADS                    reads x.bin res.bin w.bin, writes y.bin newres.bin
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define PADDOCK_ALL_VARIANTS
#include "gemv.cu"
#include "norm.cu"

template <class T>
static std::vector<T> read_file(const std::string& path, size_t pad = 0) {
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) return {};
    fseek(f, 0, SEEK_END);
    const long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    std::vector<T> v(bytes / sizeof(T) + pad);
    if (fread(v.data(), 1, bytes, f) != (size_t)bytes) exit(3);
    fclose(f);
    return v;
}

template <class T>
static void write_file(const std::string& path, const std::vector<T>& v) {
    FILE* o = fopen(path.c_str(), "wb");
    fwrite(v.data(), sizeof(T), v.size(), o);
    fclose(o);
}

typedef void (*GemvFn)(const u8*, i64, int, int, const float*, int, float*, const float*);

static GemvFn pick_gemv(const std::string& fmt, int bucket) {
#define PICK_T(SUFFIX, T) \
    if (fmt == #SUFFIX && bucket == T) return gemv_##SUFFIX##_t##T;
#define PICK(SUFFIX, FMT) PICK_T(SUFFIX, 1) PICK_T(SUFFIX, 2) PICK_T(SUFFIX, 4) PICK_T(SUFFIX, 8)
    PADDOCK_FORMATS(PICK)
    exit(4);
}

int main(int argc, char** argv) {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "gemv" && argc == 10) {
        const std::string fmt = argv[2], dir = argv[5];
        const int bucket = atoi(argv[3]), warps = atoi(argv[4]), n_rows = atoi(argv[6]), n_cols = atoi(argv[7]);
        const int n_tok = atoi(argv[8]);
        const i64 row_bytes = atoll(argv[9]);
        auto w = read_file<uint4>(dir + "/w.bin", 2);  // 16-byte aligned and padded, as on the GPU
        auto x = read_file<float>(dir + "/x.bin");
        auto bias = read_file<float>(dir + "/bias.bin");
        std::vector<float> y((size_t)n_tok * n_rows, NAN);
        const int rows_per_block = bucket <= 2 ? 4 : 2;
        GemvFn fn = pick_gemv(fmt, bucket);
        launch({(unsigned)((n_rows + rows_per_block - 1) / rows_per_block), 1, 1}, {(unsigned)(32 * warps), 1, 1}, [&] {
            fn(reinterpret_cast<const u8*>(w.data()), row_bytes, n_rows, n_cols, x.data(), n_tok, y.data(),
               bias.empty() ? nullptr : bias.data());
        });
        write_file(dir + "/y.bin", y);
        return 0;
    }
    if (cmd == "add_rms_norm" && argc == 7) {
        const std::string dir = argv[2];
        const int rows = atoi(argv[3]), cols = atoi(argv[4]), threads = atoi(argv[6]);
        const float eps = (float)atof(argv[5]);
        auto x = read_file<float>(dir + "/x.bin");
        auto res = read_file<float>(dir + "/res.bin");
        auto w = read_file<float>(dir + "/w.bin");
        std::vector<float> y((size_t)rows * cols, NAN), newres((size_t)rows * cols, NAN);
        launch({(unsigned)rows, 1, 1}, {(unsigned)threads, 1, 1},
               [&] { add_rms_norm(x.data(), res.data(), w.data(), y.data(), newres.data(), cols, eps); });
        write_file(dir + "/y.bin", y);
        write_file(dir + "/newres.bin", newres);
        return 0;
    }
    return 2;
}
