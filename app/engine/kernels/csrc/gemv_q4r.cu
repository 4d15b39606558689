// Products of 1..128 tokens on Q4_K weights repacked for the tensor cores ("q4r"): the decode step of
// many sequences, where cuBLAS on a float16 copy reads 2 bytes a weight and gemv_mma2.cu, decoding the
// GGUF blocks in place, falls behind it above 16 tokens.
//
// The layout (q4r_pack below writes it from the Q4_K rows, once, at load): per 16-row tile and
// 64-column chunk, 512 bytes of 4-bit codes in mma.sync A-fragment order, lane l's 16 bytes at 16 l,
// one 32-bit word per k-step of 16 columns. For lane (g = l / 4, t = l % 4) and k-step j, the word's
// nibbles 0..7 (bits 4i..4i+3) are the codes of (row, column) =
//   0: (g, 16j+2t)   4: (g, 16j+2t+1)   1: (g+8, 16j+2t)   5: (g+8, 16j+2t+1)
//   2: (g, 16j+2t+8) 6: (g, 16j+2t+9)   3: (g+8, 16j+2t+8) 7: (g+8, 16j+2t+9)
// so `word & 0x000f000f` is A's a[0] pair and `word & 0x00f000f0` its a[1] pair (times 16), and the
// same of `word >> 8` a[2] and a[3]: OR-ed into the exponent 0x6400 (1024.0 in float16) each is two
// float16 values 1024 + q (or 1024 + 16 q), exact, with no integer-to-float conversion.
// Scales: Q4_K's w = d sc q - dmin m per 32-column sub-block becomes the float16 pair (s, m) =
// (d sc, -dmin m) per row and sub-block, times 2^e, one e per row chosen so the row's largest
// |15 s| + |m| lies in [2^12, 2^13): every value stays a normal float16 (rows of one tile may differ by
// any factor; along a row Q4_K's scales span far less than float16's range), and the products' float32
// sums are multiplied by 2^-e (`row_scale`) at the end. Rows g+8 store s / 16 (their codes come
// times 16). Per tile and 256-column superblock lane (g, t) holds 16 bytes: the pairs of (row g,
// sub-block 2t), (g+8, 2t), (g, 2t+1), (g+8, 2t+1); the chunk q of a superblock uses sub-blocks 2q and
// 2q+1, all held by lane (g, q), so a warp takes a chunk's scales with four shuffles. 0.625 bytes a
// weight (Q4_K: 0.5625; a float16 copy: 2).
//
// The product: a block of WARPS warps owns 64 MT rows (each warp MT 16-row tiles); x (float16, from the
// pre-pass gemv_q4r_x16) is staged per chunk in shared memory by cp.async, STAGES chunks in flight, with
// 16-byte columns swizzled by token so ldmatrix reads it without bank conflicts, and every warp reads
// its B fragments from it. The weight words and scale pairs of each warp's tiles ride the same stages
// (Q4R_WSMEM=1): each warp copies its own tiles' records, so a block keeps STAGES - 1 chunks of weights
// in flight whatever its registers (the first issued before the wait on the previous kernel: weights
// are no kernel's output). Held in registers instead (Q4R_WSMEM=0, WPF chunks ahead, kept for the A/B),
// a block had two chunks of its weights in flight and waited on HBM latency: the H200 read 1.6 of its
// 4.8 TB/s at one token, and each warp stalled the block's barrier while its loads were out. A weight fragment is
// decoded once (one AND-OR, one subtraction and one FMA per pair of weights, in float16) and used for
// all NT 8-token tiles. Where row blocks are few, gridDim.y splits the chunks among blocks: each writes
// its sums to `work`, and the last to finish (a counter per row block, reset by that block) adds them
// in split order, so the result does not depend on which finished first.
//
// Numerics: w = s q + m rounded once to float16 from float16 s and m (each within 2^-11 of d sc and
// dmin m, scaled by 2^e), x rounded to float16, float32 accumulation.
//
// Q4R_FMT=1 builds read the byte layout ("q8r", q8r_pack): codes of up to 8 bits, one byte a weight, and an
// (s, m) pair per row and 16 columns, for Q6_K (w = d sc (q - 32): s = d sc, m = -32 s) and for Q4_K weights
// stacked with a Q6_K one (Q4_K_M's q/k/v where v is Q6_K). Per tile and chunk lane (g, t) holds 32 bytes,
// k-steps 0-1 then 2-3 (each two words: bytes (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1), then the same at
// columns +8), stored as two 16-byte planes of the warp; and 8 bytes of pairs, (row g, row g+8) for the
// columns of k-step t, which the warp shuffles from lane (g, j) at k-step j. A byte b becomes float16
// 1024 + b by a byte permute with 0x64. 1.25 bytes a weight (Q6_K: 0.82; a float16 copy: 2).
#include "mma.cuh"

#ifndef Q4R_MT
#define Q4R_MT 2  // 16-row tiles a warp
#endif
#ifndef Q4R_NT
#define Q4R_NT 2  // 8-token tiles
#endif
#ifndef Q4R_WPF
#define Q4R_WPF 2  // chunks of weight words in flight in registers
#endif
#ifndef Q4R_ACT
#define Q4R_ACT -1  // >= 0: a gated pair's act(gate) * up in the epilogue (common.cuh's gated_act: 0 silu, 1 gelu-tanh)
#endif
#ifndef Q4R_FMT
#define Q4R_FMT 0  // 0: the 4-bit layout (Q4_K); 1: the byte layout (Q6_K, mixed stacks)
#endif
#ifndef Q4R_WSMEM
#define Q4R_WSMEM 1  // 1: weight records staged in shared memory with x; 0: in registers, WPF chunks ahead
#endif
#ifndef Q4R_STAGES
#define Q4R_STAGES 4  // chunks a block's shared memory holds (kernels/gemv_q4r.py picks them by its size)
#endif

namespace q4r {
constexpr int MT = Q4R_MT, NT = Q4R_NT, WPF = Q4R_WPF;
constexpr int WARPS = 4;
constexpr int THREADS = 32 * WARPS;
constexpr int ROWS = 16 * MT * WARPS;             // rows a block
constexpr int TOK = 8 * NT;                       // tokens staged (zeros past n_tok)
constexpr int CHUNK = 64;                         // columns a chunk
constexpr int STAGES = Q4R_STAGES;                // chunks in shared memory, STAGES - 1 in flight
constexpr int X_BYTES = TOK * CHUNK * 2;          // a stage's x
// A tile's record a chunk, in 16-byte units: its codes, then its scale pairs (4-bit: the pairs of the
// chunk's 256-column superblock, read again by the superblock's next three chunks, from L1).
constexpr int CODE_UNITS = Q4R_FMT == 1 ? 64 : 32;
constexpr int SCALE_UNITS = Q4R_FMT == 1 ? 16 : 32;
constexpr int RECORD_BYTES = Q4R_WSMEM ? 16 * (CODE_UNITS + SCALE_UNITS) : 0;
constexpr int STAGE_BYTES = X_BYTES + WARPS * MT * RECORD_BYTES;
constexpr int SMEM_BYTES = STAGES * STAGE_BYTES;  // dynamic shared memory (gemv_q4r.py: shared_bytes)
static_assert(STAGES >= 2, "gemv_q4r: the pipeline needs two stages");
}  // namespace q4r

// The A fragment of one 16x16 weight tile from its code word and its rows' (s, m) pairs.
__device__ __forceinline__ void q4r_decode(u32 q, u32 pair_g, u32 pair_g8, u32* a) {
    const u32 s_g = __byte_perm(pair_g, 0, 0x1010), m_g = __byte_perm(pair_g, 0, 0x3232);
    const u32 s_g8 = __byte_perm(pair_g8, 0, 0x1010), m_g8 = __byte_perm(pair_g8, 0, 0x3232);
    a[0] = h2_fma(h2_sub((q & 0x000f000fu) | H2_1024, H2_1024), s_g, m_g);
    a[1] = h2_fma(h2_sub((q & 0x00f000f0u) | H2_1024, H2_1024), s_g8, m_g8);
    q >>= 8;
    a[2] = h2_fma(h2_sub((q & 0x000f000fu) | H2_1024, H2_1024), s_g, m_g);
    a[3] = h2_fma(h2_sub((q & 0x00f000f0u) | H2_1024, H2_1024), s_g8, m_g8);
}

// The same from the byte layout: w0 holds rows g, g+8 at columns 2t, 2t+1 of the k-step, w1 the same at +8.
__device__ __forceinline__ void q8r_decode(u32 w0, u32 w1, u32 pair_g, u32 pair_g8, u32* a) {
    const u32 s_g = __byte_perm(pair_g, 0, 0x1010), m_g = __byte_perm(pair_g, 0, 0x3232);
    const u32 s_g8 = __byte_perm(pair_g8, 0, 0x1010), m_g8 = __byte_perm(pair_g8, 0, 0x3232);
    a[0] = code_pair<0x4140u>(w0, 0x64646464u, s_g, m_g);
    a[1] = code_pair<0x4342u>(w0, 0x64646464u, s_g8, m_g8);
    a[2] = code_pair<0x4140u>(w1, 0x64646464u, s_g, m_g);
    a[3] = code_pair<0x4342u>(w1, 0x64646464u, s_g8, m_g8);
}

namespace q4r {
// A lane's share of one (16-row tile, chunk) of each layout: `load` its words, `pairs` the scale pairs of the
// chunk's four k-steps (p[2j]: row g, p[2j + 1]: row g + 8; shuffles: every lane of the warp calls it), and
// `decode` k-step j's A fragment.
struct RecordQ4 {
    uint4 code, scale;
    __device__ __forceinline__ void load(const uint4* codes, const uint4* scales, i64 tile, int n_chunks, int cc,
                                         int lane) {
        code = __ldg(codes + (tile * n_chunks + cc) * 32 + lane);
        scale = __ldg(scales + (tile * (n_chunks >> 2) + (cc >> 2)) * 32 + lane);
    }
    // Copy lane's units of (tile, chunk cc)'s record into `rec` (shared memory; this thread's open group).
    static __device__ __forceinline__ void stage(uint4* rec, const uint4* codes, const uint4* scales, i64 tile,
                                                 int n_chunks, int cc, int lane) {
        cp_async16(rec + lane, codes + (tile * n_chunks + cc) * 32 + lane, true);
        cp_async16_ca(rec + 32 + lane, scales + (tile * (n_chunks >> 2) + (cc >> 2)) * 32 + lane, true);
    }
    __device__ __forceinline__ void load_staged(const uint4* rec, int lane) {
        code = rec[lane];
        scale = rec[32 + lane];
    }
    __device__ __forceinline__ void pairs(int cc, int lane, u32* p) const {
        const int owner = (lane & ~3) | (cc & 3);  // lane (g, chunk % 4) holds this chunk's pairs
        p[0] = p[2] = __shfl_sync(0xffffffffu, scale.x, owner);
        p[1] = p[3] = __shfl_sync(0xffffffffu, scale.y, owner);
        p[4] = p[6] = __shfl_sync(0xffffffffu, scale.z, owner);
        p[5] = p[7] = __shfl_sync(0xffffffffu, scale.w, owner);
    }
    __device__ __forceinline__ void decode(int j, const u32* p, u32* a) const {
        q4r_decode(j == 0 ? code.x : j == 1 ? code.y : j == 2 ? code.z : code.w, p[2 * j], p[2 * j + 1], a);
    }
};
struct RecordQ8 {
    uint4 code[2];
    uint2 scale;
    __device__ __forceinline__ void load(const uint4* codes, const uint4* scales, i64 tile, int n_chunks, int cc,
                                         int lane) {
        const uint4* c = codes + (tile * n_chunks + cc) * 64 + lane;
        code[0] = __ldg(c);
        code[1] = __ldg(c + 32);
        scale = __ldg(reinterpret_cast<const uint2*>(scales) + (tile * n_chunks + cc) * 32 + lane);
    }
    static __device__ __forceinline__ void stage(uint4* rec, const uint4* codes, const uint4* scales, i64 tile,
                                                 int n_chunks, int cc, int lane) {
        const uint4* c = codes + (tile * n_chunks + cc) * 64;
        cp_async16(rec + lane, c + lane, true);
        cp_async16(rec + 32 + lane, c + 32 + lane, true);
        if (lane < 16) cp_async16(rec + 64 + lane, scales + (tile * n_chunks + cc) * 16 + lane, true);  // 32 uint2
    }
    __device__ __forceinline__ void load_staged(const uint4* rec, int lane) {
        code[0] = rec[lane];
        code[1] = rec[32 + lane];
        scale = reinterpret_cast<const uint2*>(rec + 64)[lane];
    }
    __device__ __forceinline__ void pairs(int, int lane, u32* p) const {
#pragma unroll
        for (int j = 0; j < 4; ++j) {  // lane (g, j) holds k-step j's pairs
            p[2 * j] = __shfl_sync(0xffffffffu, scale.x, (lane & ~3) | j);
            p[2 * j + 1] = __shfl_sync(0xffffffffu, scale.y, (lane & ~3) | j);
        }
    }
    __device__ __forceinline__ void decode(int j, const u32* p, u32* a) const {
        const uint4 h = code[j >> 1];
        q8r_decode((j & 1) ? h.z : h.x, (j & 1) ? h.w : h.y, p[2 * j], p[2 * j + 1], a);
    }
};
#if Q4R_FMT == 1
typedef RecordQ8 Record;
#else
typedef RecordQ4 Record;
#endif

// Start copying chunk `cc` of x into stage buffer `xs` (one commit group, empty past `c_end`): token n's
// 16-byte column q lands at column q ^ (n & 7). Thread i copies column q = i % 8 of tokens i / 8 + 16 k,
// so its source advances by 16 rows and its destination by 16 staged rows (same swizzle) per k: `x_row`
// is its first token's row of x (clamped into x: past n_tok the copy reads nothing and writes zeros).
__device__ __forceinline__ void stage_x(u16* xs, const u16* __restrict__ x_row, int n0, int n_tok, int n_cols, int cc,
                                        int c_end) {
    constexpr int PER = (TOK * 8 + THREADS - 1) / THREADS;  // copies a thread
    if (cc < c_end && (TOK * 8 >= THREADS || (int)threadIdx.x < TOK * 8)) {
        const int q = threadIdx.x & 7;
        u16* dst = xs + n0 * CHUNK + 8 * (q ^ (n0 & 7));
        const u16* src = x_row + cc * CHUNK + 8 * q;
#pragma unroll
        for (int k = 0; k < PER; ++k) {
            const int n = n0 + 16 * k;
            cp_async16(dst + 16 * k * CHUNK, src + (i64)(min(n, n_tok - 1) - min(n0, n_tok - 1)) * n_cols, n < n_tok);
        }
    }
    cp_async_commit();
}

// The stage of a block's k-th chunk.
__device__ __forceinline__ u8* stage_at(u8* smem, int k) { return smem + (k % STAGES) * STAGE_BYTES; }

// Start copying the records of this warp's tiles (`tile_of`) for chunk `cc` into stage `stage`'s weight area,
// into this thread's open group (stage_x commits it); nothing past `c_end`.
__device__ __forceinline__ void stage_w(u8* stage, const uint4* __restrict__ codes, const uint4* __restrict__ scales,
                                        const i64* tile_of, int n_chunks, int cc, int c_end, int warp, int lane) {
    if (RECORD_BYTES == 0 || cc >= c_end) return;
    uint4* rec = reinterpret_cast<uint4*>(stage + X_BYTES) + warp * MT * (CODE_UNITS + SCALE_UNITS);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
        Record::stage(rec + mt * (CODE_UNITS + SCALE_UNITS), codes, scales, tile_of[mt], n_chunks, cc, lane);
}
}  // namespace q4r

// The pre-pass: `xh = float16(x)` (n elements, a multiple of 4). One thread per 4 elements.
extern "C" __global__ void gemv_q4r_x16(const float* __restrict__ x, u32* __restrict__ xh, int n) {
    after_previous_grid();
    const int stride = gridDim.x * blockDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n / 4; i += stride) {
        const float4 v = reinterpret_cast<const float4*>(x)[i];
        reinterpret_cast<uint2*>(xh)[i] = make_uint2(pack_h2_rn(v.x, v.y), pack_h2_rn(v.z, v.w));
    }
}

// `y[n, :] = row_scale * (x[n] @ W.T) (+ bias)` for n < n_tok <= 8 NT, W the repacked weight of n_rows
// (a multiple of 16) by n_cols (a multiple of 256), x the float16 `xh`; `interleaved`: W's tiles alternate
// between two weights of n_rows / 2 (columns [first | second] of y), and a Q4R_ACT build writes
// y [n_tok, n_rows / 2] = act(first) * second instead. Grid: (cdiv(n_rows, ROWS), splits); with splits > 1,
// `work` holds splits * n_tok * n_rows floats and `counters` one zero int per row block (left zero again).
extern "C" __global__ void __launch_bounds__(q4r::THREADS)
    gemv_q4r(const uint4* __restrict__ codes, const uint4* __restrict__ scales, const float* __restrict__ row_scale,
             int n_rows, int n_cols, const u16* __restrict__ xh, int n_tok, float* __restrict__ y,
             const float* __restrict__ bias, float* __restrict__ work, int* __restrict__ counters, int interleaved) {
    using namespace q4r;
    static_assert(Q4R_ACT < 0 || MT == 2, "gemv_q4r: a gated epilogue pairs a warp's two tiles");
    PADDOCK_DYNAMIC_SHARED(u8, smem);  // STAGES x [x: TOK x CHUNK halves | WARPS x MT tile records]
    __shared__ int last_block;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int n_chunks = n_cols / CHUNK, n_tiles = n_rows / 16;
    const int c_begin = (int)((i64)n_chunks * blockIdx.y / gridDim.y);
    const int c_end = (int)((i64)n_chunks * (blockIdx.y + 1) / gridDim.y);
    const int tile0 = blockIdx.x * (ROWS / 16) + warp * MT;  // the warp's first 16-row tile

    i64 tile_of[MT];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) tile_of[mt] = min(tile0 + mt, n_tiles - 1);  // past the end: valid, never written
#if Q4R_WSMEM
    // the first stages' weights join the first group (stage_x below commits it): all land by its wait
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s)
        stage_w(stage_at(smem, s), codes, scales, tile_of, n_chunks, c_begin + s, c_end, warp, lane);
#else
    Record next[WPF][MT];  // the weight words and scale pairs of the next WPF chunks
#pragma unroll
    for (int s = 0; s < WPF; ++s)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) next[s][mt].load(codes, scales, tile_of[mt], n_chunks, min(c_begin + s, c_end - 1), lane);
#endif
    after_previous_grid();  // x, y and the work buffer belong to the kernels around this one

    float c[MT][NT][4];
    zero_tiles(c);

    const int x_n0 = threadIdx.x >> 3;  // this thread's first staged token (stage_x)
    const u16* x_row = xh + (i64)min(x_n0, n_tok - 1) * n_cols;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s)
        stage_x(reinterpret_cast<u16*>(stage_at(smem, s)), x_row, x_n0, n_tok, n_cols, c_begin + s, c_end);
    // ldmatrix: lane l gives row l % 8 of matrix l / 8; matrices 0/1 are columns 0-7/8-15 of a k-step
    // for tokens 16 p .. +7, matrices 2/3 the same for tokens 16 p + 8 .. +15 (with one n-tile, again 0/1)
    const int ld_tok = (NT > 1 ? 8 * (lane >> 4) : 0) + (lane & 7), ld_half = (lane >> 3) & 1;
    constexpr int STEP = Q4R_WSMEM ? 1 : WPF;  // chunks an outer turn (WPF: the register slots stay static)

    for (int cb = c_begin; cb < c_end; cb += STEP) {
#pragma unroll
        for (int s = 0; s < STEP; ++s) {
            const int cc = cb + s;
            if (cc >= c_end) break;
            cp_async_wait<STAGES - 2>();
            __syncthreads();  // chunk cc has landed, and every warp is done with the stage it overwrites next
            u8* ahead = stage_at(smem, cc - c_begin + STAGES - 1);
            stage_w(ahead, codes, scales, tile_of, n_chunks, cc + STAGES - 1, c_end, warp, lane);
            stage_x(reinterpret_cast<u16*>(ahead), x_row, x_n0, n_tok, n_cols, cc + STAGES - 1, c_end);
            const u8* here = stage_at(smem, cc - c_begin);
            Record rec[MT];
#if Q4R_WSMEM
            const uint4* staged = reinterpret_cast<const uint4*>(here + X_BYTES) + warp * MT * (CODE_UNITS + SCALE_UNITS);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) rec[mt].load_staged(staged + mt * (CODE_UNITS + SCALE_UNITS), lane);
#else
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) rec[mt] = next[s][mt];
            if (cc + WPF < c_end) {
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) next[s][mt].load(codes, scales, tile_of[mt], n_chunks, cc + WPF, lane);
            }
#endif
            const u16* xs = reinterpret_cast<const u16*>(here);
            u32 pairs[MT][8];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) rec[mt].pairs(cc, lane, pairs[mt]);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                u32 a[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) rec[mt].decode(j, pairs[mt], a[mt]);
#pragma unroll
                for (int p = 0; p < (NT + 1) / 2; ++p) {
                    const int n = 16 * p + ld_tok, col16 = 2 * j + ld_half;
                    u32 b[4];
                    ldsm_x4(b, xs + n * CHUNK + 8 * (col16 ^ (n & 7)));
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        mma_16816(c[mt][2 * p], a[mt], b);
                        if (2 * p + 1 < NT) mma_16816(c[mt][2 * p + 1], a[mt], b + 2);
                    }
                }
            }
        }
    }
    cp_async_wait<0>();  // no copy may still target shared memory when the block exits

    // Row of c[mt][nt][e]: 16 (tile0 + mt) + g + 8 (e / 2); token: 8 nt + 2 t + e % 2.
    const bool split = gridDim.y > 1;
    if (split) {
        float* mine = work + (i64)blockIdx.y * n_tok * n_rows;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int row = 16 * (tile0 + mt) + g + 8 * (e >> 1), n = 8 * nt + 2 * t + (e & 1);
                    if (row < n_rows && n < n_tok) mine[(i64)n * n_rows + row] = c[mt][nt][e];
                }
        __threadfence();  // this block's sums are visible device-wide before it counts itself done
        __syncthreads();
        if (threadIdx.x == 0) last_block = atomicAdd(counters + blockIdx.x, 1) == (int)gridDim.y - 1;
        __syncthreads();
        if (!last_block) return;
        __threadfence();
    }
    // Output column of a packed row: itself, or with two weights' tiles interleaved (gate/up: tile 2 i is the
    // first's tile i, 2 i + 1 the second's) its place in [first | second].
    const int half_rows = n_rows / 2;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        const int tile = tile0 + mt;
        if (tile >= n_tiles) continue;
        const float scale[2] = {__ldg(row_scale + 16 * tile + g), __ldg(row_scale + 16 * tile + g + 8)};
        const int tile_col = interleaved ? (tile & 1) * half_rows + 16 * (tile >> 1) : 16 * tile;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = 16 * tile + g + 8 * (e >> 1), n = 8 * nt + 2 * t + (e & 1);
                if (n >= n_tok) continue;
                float sum = c[mt][nt][e];
                if (split) {  // every split's sums, in split order (L2 reads: other blocks wrote them)
                    sum = 0.f;
                    const float* part = work + (i64)n * n_rows + row;
                    const i64 stride = (i64)n_tok * n_rows;
#pragma unroll 1
                    for (int k = 0; k < (int)gridDim.y; ++k) sum += __ldcg(part + k * stride);
                }
                const int col = tile_col + g + 8 * (e >> 1);
                const float v = sum * scale[e >> 1] + (bias != nullptr ? __ldg(bias + col) : 0.f);
                if (Q4R_ACT >= 0) c[mt][nt][e] = v;  // paired below
                else y[(i64)n * n_rows + col] = v;
            }
    }
#if Q4R_ACT >= 0
    if (tile0 < n_tiles) {  // the warp's tiles are gate tile p and up tile p: y [n_tok, n_rows / 2]
        const int p = tile0 >> 1;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int n = 8 * nt + 2 * t + (e & 1);
                if (n < n_tok)
                    y[(i64)n * half_rows + 16 * p + g + 8 * (e >> 1)] = gated_act<Q4R_ACT>(c[0][nt][e], c[1][nt][e]);
            }
    }
#endif
    if (split && threadIdx.x == 0) counters[blockIdx.x] = 0;  // for the next launch, which starts after this grid
}

// -- the repacking (once per weight, at load) ------------------------------------------------------------
namespace q4r {
constexpr int PACK_THREADS = 256;
constexpr int Q4K_BYTES = 144;  // d, dmin (float16), 12 bytes of 6-bit scales and mins, 128 bytes of codes

// Sub-block j's (6-bit scale, 6-bit min) of a Q4_K block's 12 scale bytes (ggml's get_scale_min_k4).
__device__ __forceinline__ void scale_min(const u8* s, int j, int& sc, int& mn) {
    if (j < 4) {
        sc = s[j] & 63;
        mn = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
        mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// The 4-bit code of column `col` of a Q4_K row.
__device__ __forceinline__ u32 code_at(const u8* row, int col) {
    const u8* blk = row + (col >> 8) * Q4K_BYTES;
    const int in = col & 255, group = in >> 6, l = in & 63;
    const u32 byte = blk[16 + 32 * group + (l & 31)];
    return l < 32 ? byte & 0xfu : byte >> 4;
}
constexpr int Q6K_BYTES = 210;  // 128 bytes of low 4 bits, 64 of high 2 bits, 16 int8 scales, d (float16)

// The 6-bit code (0..63) of column `col` of a Q6_K row (ggml's dequantize_row_q6_K).
__device__ __forceinline__ u32 code_at_q6(const u8* row, int col) {
    const u8* blk = row + (col >> 8) * Q6K_BYTES;
    const int i = col & 255, n = i >> 7, part = (i & 127) >> 5, l = i & 31;
    const u32 lo = (blk[64 * n + l + 32 * (part & 1)] >> (4 * (part >> 1))) & 0xfu;
    const u32 hi = (blk[128 + 32 * n + l] >> (2 * part)) & 3u;
    return lo | hi << 4;
}

// (s, m) of 16-column group `group` of a Q4_K (q6 false) or Q6_K row: w = s q + m.
__device__ __forceinline__ void pair_at(const u8* row, int group, bool q6, float& s, float& m) {
    if (q6) {
        const u8* blk = row + (group >> 4) * Q6K_BYTES;
        const float d = h2f((u16)(blk[208] | blk[209] << 8));
        s = d * (float)(signed char)blk[192 + (group & 15)];
        m = -32.f * s;
    } else {
        const u8* blk = row + (group >> 4) * Q4K_BYTES;
        const float d = h2f((u16)(blk[0] | blk[1] << 8)), dmin = h2f((u16)(blk[2] | blk[3] << 8));
        int sc, mn;
        scale_min(blk + 4, (group & 15) >> 1, sc, mn);
        s = d * sc;
        m = -dmin * mn;
    }
}

// Each of the tile's 16 rows' factor 2^e (into `factor`, shared memory) and 2^-e (row_scale), from the largest
// qmax |s| + |m| of its 16-column groups, a warp a row at a time: that times 2^e lies in [2^12, 2^13)
// (e = 12 - floor(log2 most)); 1 for an all-zero row. Ends with a barrier: `factor` is the block's.
__device__ __forceinline__ void row_factors(const u8* w, i64 row_bytes, int n_rows, int n_cols, bool q6, int tile,
                                            int out_tile, float* factor, float* row_scale) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_groups = n_cols / 16;
    const float qmax = q6 ? 63.f : 15.f;
    for (int i = warp; i < 16; i += PACK_THREADS / 32) {
        const int r = 16 * tile + i;
        float most = 0.f;
        for (int gi = lane; r < n_rows && gi < n_groups; gi += 32) {
            float s, m;
            pair_at(w + r * row_bytes, gi, q6, s, m);
            most = fmaxf(most, qmax * fabsf(s) + fabsf(m));
        }
        for (int o = 16; o > 0; o >>= 1) most = fmaxf(most, __shfl_xor_sync(0xffffffffu, most, o));
        const int e = most > 0.f && most < PADDOCK_INF
                          ? min(max(139 - (int)((__float_as_uint(most) >> 23) & 255), -100), 100)
                          : 0;
        if (lane == 0) {
            factor[i] = ldexpf(1.f, e);
            row_scale[16 * out_tile + i] = ldexpf(1.f, -e);
        }
    }
    __syncthreads();
}
}  // namespace q4r

// One 16-row tile of a Q4_K weight (rows past n_rows: zeros) into the q4r layout: grid = cdiv(n_rows, 16)
// tiles, starting at output tile `tile_offset` (weights stacked along the output: q/k/v, gate/up).
extern "C" __global__ void __launch_bounds__(q4r::PACK_THREADS)
    q4r_pack(const u8* __restrict__ w, i64 row_bytes, int n_rows, int n_cols, int tile_offset, uint4* __restrict__ codes,
             uint4* __restrict__ scales, float* __restrict__ row_scale) {
    using namespace q4r;
    __shared__ float factor[16];
    after_previous_grid();  // launched at load, outside graphs; a programmatic launch would find it safe too
    const int tile = blockIdx.x, n_super = n_cols / 256, n_chunks = n_cols / CHUNK;
    const int out_tile = tile_offset + tile;
    row_factors(w, row_bytes, n_rows, n_cols, false, tile, out_tile, factor, row_scale);
    // Codes: one 16-byte lane record per (chunk, lane).
    for (int i = threadIdx.x; i < n_chunks * 32; i += PACK_THREADS) {
        const int cc = i >> 5, l = i & 31, g = l >> 2, t = l & 3;
        u32 words[4];
        for (int j = 0; j < 4; ++j) {
            const int col = cc * CHUNK + 16 * j + 2 * t;
            u32 word = 0;
            // nibble k: row g (k even) or g+8 (k odd); column 2t, +1 for k = 4..7, +8 for k = 2, 3, 6, 7
            for (int k = 0; k < 8; ++k) {
                const int r = 16 * tile + g + 8 * (k & 1), c = col + ((k >> 2) & 1) + ((k >> 1) & 1) * 8;
                const u32 code = r < n_rows ? code_at(w + r * row_bytes, c) : 0u;
                word |= code << (4 * k);
            }
            words[j] = word;
        }
        codes[((i64)out_tile * n_chunks + cc) * 32 + l] = make_uint4(words[0], words[1], words[2], words[3]);
    }
    // Scale pairs: one 16-byte lane record per (superblock, lane).
    for (int i = threadIdx.x; i < n_super * 32; i += PACK_THREADS) {
        const int sb = i >> 5, l = i & 31, g = l >> 2, t = l & 3;
        u32 words[4];
        for (int k = 0; k < 4; ++k) {  // (row g, 2t), (g+8, 2t), (g, 2t+1), (g+8, 2t+1)
            const int in_tile = g + 8 * (k & 1), r = 16 * tile + in_tile, sub = 2 * t + (k >> 1);
            u32 pair = 0;
            if (r < n_rows) {
                float s, m;
                pair_at(w + r * row_bytes, 16 * sb + 2 * sub, false, s, m);  // 16-column group 2 sub of block sb
                const float f = factor[in_tile];
                pair = pack_h2_rn(s * f * ((k & 1) ? 0.0625f : 1.f), m * f);
            }
            words[k] = pair;
        }
        scales[((i64)out_tile * n_super + sb) * 32 + l] = make_uint4(words[0], words[1], words[2], words[3]);
    }
}

// -- the byte layout (Q4R_FMT=1 builds read it) --------------------------------------------------------------

// One 16-row tile of a Q4_K (source_q6 = 0) or Q6_K (1) weight into the byte layout, like q4r_pack.
extern "C" __global__ void __launch_bounds__(q4r::PACK_THREADS)
    q8r_pack(const u8* __restrict__ w, i64 row_bytes, int n_rows, int n_cols, int tile_offset, int source_q6,
             uint4* __restrict__ codes, uint2* __restrict__ scales, float* __restrict__ row_scale) {
    using namespace q4r;
    __shared__ float factor[16];
    after_previous_grid();  // launched at load, outside graphs
    const bool q6 = source_q6 != 0;
    const int tile = blockIdx.x, n_chunks = n_cols / CHUNK;
    const int out_tile = tile_offset + tile;
    row_factors(w, row_bytes, n_rows, n_cols, q6, tile, out_tile, factor, row_scale);
    // Codes: per (chunk, plane h, lane) a 16-byte record, k-steps 2h and 2h + 1, two words each.
    for (int i = threadIdx.x; i < n_chunks * 64; i += PACK_THREADS) {
        const int cc = i >> 6, h = (i >> 5) & 1, l = i & 31, g = l >> 2, t = l & 3;
        u32 words[4];
        for (int k = 0; k < 4; ++k) {  // word k: k-step 2h + k / 2, columns +8 when k is odd
            const int col = cc * CHUNK + 16 * (2 * h + (k >> 1)) + 2 * t + 8 * (k & 1);
            u32 word = 0;
            for (int b = 0; b < 4; ++b) {  // bytes: (g, col), (g, col + 1), (g + 8, col), (g + 8, col + 1)
                const int r = 16 * tile + g + 8 * (b >> 1), c = col + (b & 1);
                const u8* row = w + r * row_bytes;
                const u32 code = r >= n_rows ? 0u : q6 ? code_at_q6(row, c) : code_at(row, c);
                word |= code << (8 * b);
            }
            words[k] = word;
        }
        codes[((i64)out_tile * n_chunks + cc) * 64 + 32 * h + l] = make_uint4(words[0], words[1], words[2], words[3]);
    }
    // Pairs: per (chunk, lane (g, t)) rows g and g + 8 at 16-column group 4 chunk + t.
    for (int i = threadIdx.x; i < n_chunks * 32; i += PACK_THREADS) {
        const int cc = i >> 5, l = i & 31, g = l >> 2, t = l & 3;
        u32 pair[2] = {0u, 0u};
        for (int h = 0; h < 2; ++h) {
            const int in_tile = g + 8 * h, r = 16 * tile + in_tile;
            if (r >= n_rows) continue;
            float s, m;
            pair_at(w + r * row_bytes, 4 * cc + t, q6, s, m);
            pair[h] = pack_h2_rn(s * factor[in_tile], m * factor[in_tile]);
        }
        scales[((i64)out_tile * n_chunks + cc) * 32 + l] = make_uint2(pair[0], pair[1]);
    }
}
