// Decode every unit of a tensor with the GPU decoders (compiled for the host) and write
// float32 rows: argv = format, input file, rows, cols, row_bytes, output file.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "quant.cuh"

template <class Fmt>
static void decode(const u8* data, long rows, int cols, long row_bytes, float* out) {
    for (long r = 0; r < rows; ++r) {
        for (int u = 0; u < cols / 32; ++u) {
            Fmt f;
            f.load(data + r * row_bytes, u);
            float* y = out + r * cols + Fmt::x_base(u);
            for (int k = 0; k < 4; ++k) {
                float w0[4], w1[4];
                f.get(k, w0, w1);
                for (int i = 0; i < 4; ++i) {
                    y[4 * k + i] = w0[i];
                    y[Fmt::RUN1 + 4 * k + i] = w1[i];
                }
            }
        }
    }
}

int main(int argc, char** argv) {
    if (argc != 7) return 2;
    const std::string fmt = argv[1];
    const long rows = atol(argv[3]), row_bytes = atol(argv[5]);
    const int cols = atoi(argv[4]);
    const size_t n = (size_t)(rows * row_bytes);
    u8* data = static_cast<u8*>(aligned_alloc(16, (n + 16 + 15) / 16 * 16));  // padded like the GPU buffer
    FILE* in = fopen(argv[2], "rb");
    if (!in || fread(data, 1, n, in) != n) return 3;
    fclose(in);
    std::vector<float> out((size_t)rows * cols, NAN);
    bool known = false;
#define RUN(SUFFIX, FMT)                                          \
    if (fmt == #SUFFIX) {                                         \
        decode<FMT>(data, rows, cols, row_bytes, out.data());     \
        known = true;                                             \
    }
    PADDOCK_FORMATS(RUN)
    if (!known) return 4;
    FILE* o = fopen(argv[6], "wb");
    fwrite(out.data(), sizeof(float), out.size(), o);
    fclose(o);
    free(data);
    return 0;
}
