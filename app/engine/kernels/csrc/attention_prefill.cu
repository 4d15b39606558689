// Paged causal attention for prefill chunks on tensor cores, in the FlashAttention-2 manner.
//
// A block owns BM query rows of one sequence and one KV head, where a row is a (token, query
// head) pair of the KV head's GQA group, token-major: the group's heads share every K/V tile the
// block loads, so a GQA model reads its cache once per group, not once per head. Each of the four
// warps owns MT tiles of 16 rows: S = Q K^T for a tile of BN keys with mma.sync (f16 in, f32
// accumulate), each K fragment read from shared memory once for all MT row tiles, the online
// softmax in registers (exp2, scale folded into Q), then O += P V with P reused from S's
// accumulators as the A operand (mma.cuh) and V read by ldmatrix.trans, again once for MT tiles.
// K and V tiles arrive by cp.async, K one tile ahead in a second buffer, so the loads overlap the
// products. Two row tiles per warp halve the shared-memory reads per product, which bound the
// one-tile build (head dim 64 and 128; 256 keeps one, for registers). PF_VBUF=2 gives V a second
// buffer too: the next tile's V is issued beside its K, a tile ahead, and the barrier that kept the
// single V buffer from being overwritten under a slower warp's P @ V goes. attention_prefill.py builds
// head dim 128 with PF_VBUF=2 and PF_BN=64 where its 102 KB fit (WIDE_TILE: sm_80, sm_90).
//
// Head dim 512 (Gemma 4's global layers): a warp's O for 16 rows would be 256 floats a thread, so the value
// columns are cut into PARTS of DV = 256, one block per part (grid y = KV head x part): each block computes
// the same scores over the whole head and accumulates O for its columns only, reading only those of V.
// Its shared memory (146 KB) needs sm_80 or sm_90's opt-in sizes: attention_prefill.py says where it fits.
//
// A row of token position p sees keys [p - window + 1, p] (window 0: [0, p]); a block walks
// the union of its rows' ranges and masks per element. With gridDim.z > 1 the block's range
// is cut into that many runs of whole tiles (split-KV: a short chunk over a long cached
// context, the prefix-cache hit, still fills the GPU); each split writes its unnormalised
// output with its row max and sum, and attn_prefill_merge combines them. The split of a
// tile's range is computed here from gridDim.z, so a captured graph stays correct for any
// context length its replays bring.
//
// q float32 [T, n_heads, D]; K/V float16 [num_blocks, block_size, n_kv, D]; out float32.
//
// KV_FP8=1 builds read FP8 caches (fp8_kv.cuh: e4m3 codes of the same shape, a float32 scale per
// (block, KV head), passed after the float16 build's arguments): each tile's codes are loaded into
// registers and stored in shared memory as the float16 of their dequantized values, exact wherever a
// block's scale lies in [2^-15, 2^7] (its values' largest |x| between ~0.007 and ~57,000), so the
// products run as over a float16 cache. These loads are synchronous (no cp.async into the float16
// tile): overlap of the FP8 build is to be measured on the GPU.
#include "mma.cuh"
#if defined(KV_FP8) && KV_FP8
#include "fp8_kv.cuh"
#define PF_FP8 1
typedef u8 pf_kv_t;
#else
#define PF_FP8 0
typedef u16 pf_kv_t;
#endif

#define PF_WARPS 4
#ifndef PF_LAZY
#define PF_LAZY 0  // log2 of how far a tile's max may exceed a row's running max before O is rescaled; 0: always
#endif
#ifndef PF_VBUF
// V buffers: 1, or 2 (V a tile ahead like K; two barriers a tile instead of three). Every head dim still fits
// where it did: 256 takes 99 KB (sm_86/89/120's opt-in limit), 512 163 KB (sm_80's). The FP8 builds' loads
// are synchronous stores, ordered by the same barriers as cp.async's, so they take either.
#define PF_VBUF 1
#endif
#if PF_VBUF != 1 && PF_VBUF != 2
#error "PF_VBUF is 1 or 2"
#endif
#ifndef PF_KEY_WARPS
// PF_KEY_WARPS=1: the block's warps share its 16 MT rows and split each tile's keys, 16 a warp, instead of owning
// 16 MT rows each over all of them. For a few rows over many keys (a cascade decode's shared part: 8 sessions x 4
// heads = 32 rows a KV head) the other build leaves three warps of four on padding rows, and the useful warps of
// two resident blocks on one sub-partition's tensor core: attn_prefill_d128 read the shared keys at 0.85 TB/s
// (bench/results/gpu-s28-2026-12-07.md). Here every warp does a quarter of each tile; they combine their rows'
// (max, sum, O) through shared memory at the end. 64 keys a tile, whatever the head dim. On the H100 the shared part
// of 8 sessions over 8,000 keys (32 splits) took 29.2 us against 34.8, and a c=8 token 6.29 ms against 6.53; at
// 64 rows (two row tiles each reading the keys) 54.3 us against 37.7, hence attention_cascade.key_warps' bound
// (bench/results/gpu-s29-2026-12-07.md).
#define PF_KEY_WARPS 0
#endif
// PF_EARLY_KV=1 (with two V buffers and cp.async, i.e. float16 caches): the next tile's K and V are issued as soon
// as the barrier at the top of a tile frees their buffers, so they fly through this tile's S = Q K^T as well as
// its softmax and P @ V. On by default in the key-split build, which has registers to spare (a quarter of S a
// warp). Elsewhere an A/B build, off until measured: the wide head-dim-128 build then spills 112 bytes (255
// registers, sm_90; none without it), which may cost the long prompts' compute-bound tiles more than it saves.
#ifndef PF_EARLY_KV
#define PF_EARLY_KV PF_KEY_WARPS
#endif
#define PF_EARLY (PF_EARLY_KV && PF_VBUF == 2 && !PF_FP8)  // other builds keep their order
#ifndef PF_BN
// Keys per tile of every head dim, a multiple of 16; 0: by head dim, for registers. 64 at head dim 128 takes
// 255 registers and spills none with PF_VBUF=2 (84 bytes with 1), in 102 KB (sm_80 and sm_90 only: the
// wide tile attention_prefill.py picks there); 512 at 64 fits no device (an A/B build: supports() leaves it
// to attention.cu).
#define PF_BN 0
#endif
#define PF_PAD 8  // halves of padding per shared row: the 8 rows of a fragment land 4 banks apart
#define PF_LOG2E 1.4426950408889634f

template <int D>
struct PfShape {
    static constexpr int MT = D >= 256 ? 1 : 2;              // 16-row tiles per warp
    static constexpr int BM = (PF_KEY_WARPS ? 1 : PF_WARPS) * 16 * MT;  // query rows per block
    static constexpr int BN = PF_KEY_WARPS ? 16 * PF_WARPS
                            : PF_BN ? PF_BN : (D >= 256 || MT == 2 && D >= 128) ? 32 : 64;  // keys per tile (registers)
    static_assert(BN % 16 == 0, "P @ V takes keys 16 at a time, S's n-tiles in pairs");
    static constexpr int WK = PF_KEY_WARPS ? BN / PF_WARPS : BN;  // keys of a tile each warp takes
    static constexpr int NTW = WK / 8;                       // 8-key n-tiles of S per row tile and warp
    static constexpr int LD = D + PF_PAD;                    // shared row stride in halves
    static constexpr int KSTEPS = D / 16;                    // k-steps of S = Q K^T
    static constexpr int DV = D > 256 ? 256 : D;             // value columns a block accumulates
    static constexpr int PARTS = D / DV;                     // blocks per (row tile, KV head)
    static constexpr int LDV = DV + PF_PAD;                  // shared V row stride in halves
    static constexpr int DT = DV / 8;                        // 8-column n-tiles of O per row tile
};

// Dynamic shared memory bytes of a build: Q, two K buffers, PF_VBUF V buffers (its block's columns).
// PF_KEY_WARPS: at the end the same bytes hold each warp's (max, sum) and O of the block's rows, in float32.
#define PF_TILE_BYTES(D) \
    (((PfShape<D>::BM + 2 * PfShape<D>::BN) * PfShape<D>::LD + PF_VBUF * PfShape<D>::BN * PfShape<D>::LDV) * 2)
#define PF_COMBINE_BYTES(D) (PF_KEY_WARPS ? PF_WARPS * PfShape<D>::BM * (PfShape<D>::DV + 2) * 4 : 0)
#define PF_SMEM_BYTES(D) (PF_TILE_BYTES(D) > PF_COMBINE_BYTES(D) ? PF_TILE_BYTES(D) : PF_COMBINE_BYTES(D))

struct PfTile {
    int seq, tile, q_start, q_len, seq_len;
};

// Block `bx` -> (sequence, tile within it): sequences take cdiv(q_len * group, BM) tiles each,
// in order. Every warp scans the sequences 32 at a time with a prefix sum over its lanes.
__device__ __forceinline__ bool pf_find_tile(const int* __restrict__ qsl, const int* __restrict__ seq_lens,
                                             int n_seqs, int group, int bm, int bx, int lane, PfTile& out) {
    int base = 0;
    for (int s0 = 0; s0 < n_seqs; s0 += 32) {
        const int s = s0 + lane;
        int tiles = 0, q0 = 0, q1 = 0;
        if (s < n_seqs) {
            q0 = __ldg(qsl + s);
            q1 = __ldg(qsl + s + 1);
            tiles = ((q1 - q0) * group + bm - 1) / bm;
        }
        int incl = tiles;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, incl, off);
            if (lane >= off) incl += v;
        }
        const bool here = s < n_seqs && bx >= base + incl - tiles && bx < base + incl;
        const unsigned hit = __ballot_sync(0xffffffffu, here);
        if (hit) {
            const int src = __ffs(hit) - 1;
            const int first = __shfl_sync(0xffffffffu, incl - tiles, src);
            out.seq = s0 + src;
            out.tile = bx - base - first;
            out.q_start = __shfl_sync(0xffffffffu, q0, src);
            out.q_len = __shfl_sync(0xffffffffu, q1 - q0, src);
            out.seq_len = __ldg(seq_lens + out.seq);
            return true;
        }
        base += __shfl_sync(0xffffffffu, incl, 31);
    }
    return false;
}

// Both loaders fill a tile of BN keys x W columns from column col0 of each cached row (W = D for K; for V the
// block's DV columns), rows W + PF_PAD halves apart in `dst`.
#if PF_FP8
// KV_FP8: the tile's rows as float16 values (see the top), zeros past key_hi. `scales` [num_blocks, n_kv].
template <int D, int W>
__device__ __forceinline__ void pf_load_kv(u16* dst, const u8* __restrict__ cache, const float* __restrict__ scales,
                                           const int* __restrict__ table, int key0, int key_hi, int block_size,
                                           int n_kv, int kvh, int tid, int col0) {
    typedef PfShape<D> S;
    constexpr int CH = W / 8;  // 8-code units per row
#pragma unroll
    for (int i = tid; i < S::BN * CH; i += PF_WARPS * 32) {
        const int r = i / CH, c = (i % CH) * 8;
        const int key = key0 + r;
        uint4 h = make_uint4(0u, 0u, 0u, 0u);
        if (key < key_hi) {
            const int blk = __ldg(table + key / block_size);
            const float sc = __ldg(scales + (size_t)blk * n_kv + kvh) * E4M3_HALF_UNSCALE;
            const uint2 codes = __ldg(reinterpret_cast<const uint2*>(
                cache + (((size_t)blk * block_size + key % block_size) * n_kv + kvh) * D + col0 + c));
            const uint4 raw = e4m3x8_to_half2m8(codes);
            const u32 w[4] = {raw.x, raw.y, raw.z, raw.w};
            u32 o[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) o[j] = pack_h2(h2f_lo(w[j]) * sc, h2f_hi(w[j]) * sc);
            h = make_uint4(o[0], o[1], o[2], o[3]);
        }
        *reinterpret_cast<uint4*>(dst + r * (W + PF_PAD) + c) = h;
    }
}
#define PF_LOAD_KV(D, W, dst, cache, scales, ...) pf_load_kv<D, W>(dst, cache, scales, __VA_ARGS__)
#else
#define PF_LOAD_KV(D, W, dst, cache, scales, ...) pf_load_kv<D, W>(dst, cache, __VA_ARGS__)
#endif

template <int D, int W>
__device__ __forceinline__ void pf_load_kv(u16* dst, const u16* __restrict__ cache, const int* __restrict__ table,
                                           int key0, int key_hi, int block_size, int n_kv, int kvh, int tid, int col0) {
    typedef PfShape<D> S;
    constexpr int CH = W / 8;  // 16-byte chunks per row
#pragma unroll
    for (int i = tid; i < S::BN * CH; i += PF_WARPS * 32) {
        const int r = i / CH, c = (i % CH) * 8;
        const int key = key0 + r;
        const bool ok = key < key_hi;
        const u16* src = cache;
        if (ok) {
            const int blk = __ldg(table + key / block_size);
            src = cache + (((size_t)blk * block_size + key % block_size) * n_kv + kvh) * D + col0 + c;
        }
        cp_async16(dst + r * (W + PF_PAD) + c, src, ok);  // keys past the range: zeros, never stale NaNs
    }
}

#if PF_KEY_WARPS
// The key-split build's end: each warp holds the block's rows over its quarter of every tile's keys. They leave
// (max, sum) and O in shared memory (the tiles' bytes: every warp is past its last read of them), then each
// thread takes output elements and sums the warps' parts in warp order, weighted as the splits' merge weighs
// splits: the same bits every run. The result goes where the other build's would (out, or a split's partials).
template <int D>
__device__ __forceinline__ void pf_combine_warps(u16* smem, const float* m, const float* l, float (*o)[PfShape<D>::DT][4],
                                                 int warp, int lane, int tid, int f0, int rows, int group, int q_start,
                                                 int n_heads, int kvh, int col0, int split, int n_splits, int part,
                                                 const float* __restrict__ sinks, float* __restrict__ out,
                                                 float* __restrict__ part_o, float* __restrict__ part_ml) {
    typedef PfShape<D> S;
    constexpr int BM = S::BM, DV = S::DV, MT = S::MT;
    float* ml_s = reinterpret_cast<float*>(smem);  // [PF_WARPS][BM][2]
    float* o_s = ml_s + PF_WARPS * BM * 2;         // [PF_WARPS][BM][DV]
    const int g = lane >> 2, t4 = lane & 3;
    __syncthreads();  // every warp's last products are done with K and V
#pragma unroll
    for (int i = 0; i < 2 * MT; ++i) {
        const int r = (i >> 1) * 16 + g + (i & 1) * 8, mt = i >> 1, e0 = 2 * (i & 1);
        if (t4 == 0) {
            ml_s[(warp * BM + r) * 2] = m[i];
            ml_s[(warp * BM + r) * 2 + 1] = l[i];
        }
        float* dst = o_s + (size_t)(warp * BM + r) * DV + 2 * t4;
#pragma unroll
        for (int d = 0; d < S::DT; ++d)
            *reinterpret_cast<float2*>(dst + 8 * d) = make_float2(o[mt][d][e0], o[mt][d][e0 + 1]);
    }
    __syncthreads();
    for (int i = tid; i < BM * DV / 4; i += PF_WARPS * 32) {
        const int r = i / (DV / 4), c = (i % (DV / 4)) * 4;
        const int f = f0 + r;
        if (f >= rows) continue;
        float big = -PADDOCK_INF;
#pragma unroll
        for (int w = 0; w < PF_WARPS; ++w) big = fmaxf(big, ml_s[(w * BM + r) * 2]);
        const float use = big == -PADDOCK_INF ? 0.f : big;
        float sum = 0.f;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int w = 0; w < PF_WARPS; ++w) {
            const float mw = ml_s[(w * BM + r) * 2];
            const float wt = mw == -PADDOCK_INF ? 0.f : fast_exp2(mw - use);  // a warp with no visible key: 0
            sum += wt * ml_s[(w * BM + r) * 2 + 1];
            const float4 ow = *reinterpret_cast<const float4*>(o_s + (size_t)(w * BM + r) * DV + c);
            acc.x += wt * ow.x;
            acc.y += wt * ow.y;
            acc.z += wt * ow.z;
            acc.w += wt * ow.w;
        }
        const size_t row = (size_t)(q_start + f / group) * n_heads + kvh * group + f % group;
        if (n_splits == 1) {
            const float den = sinks == nullptr ? sum : sum + fast_exp2(sinks[kvh * group + f % group] * PF_LOG2E - big);
            const float inv = den > 0.f ? 1.f / den : 0.f;
            *reinterpret_cast<float4*>(out + row * D + col0 + c) =
                make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
        } else {
            const size_t at = row * n_splits + split;
            *reinterpret_cast<float4*>(part_o + at * D + col0 + c) = acc;
            if (c == 0 && part == 0) {  // every part has the same (max, sum)
                part_ml[2 * at] = big;
                part_ml[2 * at + 1] = sum;
            }
        }
    }
}
#endif

template <int D>
__device__ __forceinline__ void attn_prefill_body(
    const float* __restrict__ q, const pf_kv_t* __restrict__ k_cache, const pf_kv_t* __restrict__ v_cache,
    const int* __restrict__ qsl, const int* __restrict__ seq_lens, const int* __restrict__ block_tables,
    int table_stride, int n_seqs, int n_heads, int n_kv, int block_size, float scale, float softcap, int window,
    float* __restrict__ out, float* __restrict__ part_o, float* __restrict__ part_ml, const int* __restrict__ key_limit,
    const float* __restrict__ sinks, u16* smem, const float* __restrict__ k_scale, const float* __restrict__ v_scale) {
    typedef PfShape<D> S;
    constexpr int BM = S::BM, BN = S::BN, LD = S::LD, MT = S::MT, DV = S::DV;
#if defined(PF_BS) && PF_BS > 0
    // The cache's block size as a constant of the build (attention_prefill.py passes the cache's; PF_BS=0 in
    // $PADDOCK_KERNEL_DEFINES, an A/B run, takes it at run time): the loaders' key / block_size and
    // key % block_size, 16 of each a tile a thread, become shifts and masks rather than integer divisions (IABS,
    // I2F, MUFU.RCP and a dozen more instructions each: 100 IABS in the wide head-dim-128 build, 52 with it).
    block_size = PF_BS;
#endif
    u16* sQ = smem;             // [BM][LD]
    u16* sK = sQ + BM * LD;     // [2][BN][LD]
    u16* sV = sK + 2 * BN * LD; // [PF_VBUF][BN][LDV]: the block's DV columns

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int kvh = blockIdx.y / S::PARTS, part = blockIdx.y % S::PARTS, col0 = part * DV;
    const int split = blockIdx.z, n_splits = gridDim.z;
    const int group = n_heads / n_kv;
    PfTile tile;
    if (!pf_find_tile(qsl, seq_lens, n_seqs, group, BM, blockIdx.x, lane, tile)) return;  // spare blocks
    const int rows = tile.q_len * group;
    const int f0 = tile.tile * BM;
    const int ctx0 = tile.seq_len - tile.q_len;  // position of the chunk's first token
    const int pos_lo = ctx0 + f0 / group, pos_hi = ctx0 + (min(f0 + BM, rows) - 1) / group;
    const int key_lo = window > 0 ? max(0, pos_lo - window + 1) : 0;
    // key_limit (nullable, a step input): no key at or past *key_limit is read, whatever the rows' positions
    // (the shared prefix of a cascade decode: every row sees exactly the prefix's keys).
    const int key_hi = key_limit == nullptr ? pos_hi + 1 : min(pos_hi + 1, __ldg(key_limit));
    const int n_key_tiles = (key_hi - key_lo + BN - 1) / BN;
    const int per_split = (n_key_tiles + n_splits - 1) / n_splits;
    const int kt0 = split * per_split, kt1 = min(n_key_tiles, kt0 + per_split);
    const int* table = block_tables + (size_t)tile.seq * table_stride;
    const int warp_row = PF_KEY_WARPS ? 0 : warp * 16 * MT;  // the warp's first row in the block
    const int warp_key = PF_KEY_WARPS ? warp * S::WK : 0;    // the warp's first key of a tile

    // This thread's rows: g and g + 8 of each of its warp's row tiles (index 2 mt + h); their
    // positions, -1 for padding rows.
    int fr[2 * MT], pos[2 * MT];
    float m[2 * MT], l[2 * MT];
#pragma unroll
    for (int i = 0; i < 2 * MT; ++i) {
        fr[i] = f0 + warp_row + (i >> 1) * 16 + g + (i & 1) * 8;
        pos[i] = fr[i] < rows ? ctx0 + fr[i] / group : -1;
        m[i] = -PADDOCK_INF;
        l[i] = 0.f;
    }
    float o[MT][S::DT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < S::DT; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
    const float q_scale = softcap > 0.f ? scale : scale * PF_LOG2E;
    const float inv_softcap = softcap > 0.f ? 1.f / softcap : 0.f, softcap_log2 = softcap * PF_LOG2E;

    if (kt0 < kt1) {
        PF_LOAD_KV(D, D, sK, k_cache, k_scale, table, key_lo + kt0 * BN, key_hi, block_size, n_kv, kvh, tid, 0);
        cp_async_commit();
        PF_LOAD_KV(D, DV, sV, v_cache, v_scale, table, key_lo + kt0 * BN, key_hi, block_size, n_kv, kvh, tid, col0);
        cp_async_commit();
        for (int i = tid; i < BM * D / 4; i += PF_WARPS * 32) {  // Q, scaled, as f16
            const int r = i / (D / 4), c = (i % (D / 4)) * 4;
            const int f = f0 + r;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (f < rows) {
                const int tok = tile.q_start + f / group, head = kvh * group + f % group;
                v = *reinterpret_cast<const float4*>(q + ((size_t)tok * n_heads + head) * D + c);
            }
            u32* dst = reinterpret_cast<u32*>(sQ + r * LD + c);
            dst[0] = pack_h2_rn(v.x * q_scale, v.y * q_scale);
            dst[1] = pack_h2_rn(v.z * q_scale, v.w * q_scale);
        }
    }
    // A-fragment rows of ldmatrix.x4: matrices (rows 0-7 | 8-15) x (columns 0-7 | 8-15) of a row tile
    const u16* q_rows = sQ + (warp_row + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8;
    // B-fragment rows for two 8-key n-tiles: keys (0-7 | 8-15 by lane / 16) x d (0-7 | 8-15 by lane / 8 % 2)
    const int k_row = (lane & 7) + (lane >> 4) * 8, k_col = ((lane >> 3) & 1) * 8;

    for (int kt = kt0; kt < kt1; ++kt) {
        const u16* kb = sK + ((kt - kt0) & 1) * BN * LD;
        cp_async_wait<1>();  // this tile's K (its V may still be in flight)
        __syncthreads();
        const bool more = kt + 1 < kt1;
#if PF_EARLY
        // the other K and V buffers held the previous tile, whose products every warp finished before the barrier
        if (more) {
            PF_LOAD_KV(D, D, sK + ((kt + 1 - kt0) & 1) * BN * LD, k_cache, k_scale, table, key_lo + (kt + 1) * BN,
                       key_hi, block_size, n_kv, kvh, tid, 0);
            cp_async_commit();
            PF_LOAD_KV(D, DV, sV + ((kt + 1 - kt0) & 1) * BN * S::LDV, v_cache, v_scale, table, key_lo + (kt + 1) * BN,
                       key_hi, block_size, n_kv, kvh, tid, col0);
            cp_async_commit();
        }
#endif
        float s[MT][S::NTW][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int j = 0; j < S::NTW; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < S::KSTEPS; ++kk) {
            u32 a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) ldsm_x4(a[mt], q_rows + mt * 16 * LD + 16 * kk);
#pragma unroll
            for (int j = 0; j < S::NTW; j += 2) {
                u32 b[4];
                ldsm_x4(b, kb + (warp_key + 8 * j + k_row) * LD + 16 * kk + k_col);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma_16816(s[mt][j], a[mt], b);
                    mma_16816(s[mt][j + 1], a[mt], b + 2);
                }
            }
        }
#if !PF_EARLY
        if (more) {  // the next K into the other buffer, behind this tile's softmax and P @ V
            PF_LOAD_KV(D, D, sK + ((kt + 1 - kt0) & 1) * BN * LD, k_cache, k_scale, table, key_lo + (kt + 1) * BN,
                       key_hi, block_size, n_kv, kvh, tid, 0);
            cp_async_commit();
#if PF_VBUF == 2
            // and its V into the other V buffer, which the barrier above freed as it freed K's: every warp
            // had finished the previous tile's P @ V, the last read of that buffer
            PF_LOAD_KV(D, DV, sV + ((kt + 1 - kt0) & 1) * BN * S::LDV, v_cache, v_scale, table, key_lo + (kt + 1) * BN,
                       key_hi, block_size, n_kv, kvh, tid, col0);
            cp_async_commit();
#endif
        }
#endif

        // Scores in the log2 domain (log2 e folded into q, or applied after the cap), masked where the
        // tile crosses a row's causal edge or window (block-uniform test: most tiles of a long context
        // are wholly visible); then the online softmax of each row.
        const int key0 = key_lo + kt * BN;
        if (softcap > 0.f) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int j = 0; j < S::NTW; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[mt][j][e] = softcap_log2 * tanhf(s[mt][j][e] * inv_softcap);
        }
        const bool interior = key0 + BN - 1 <= pos_lo && key0 + BN <= key_hi && (window <= 0 || key0 > pos_hi - window);
        if (!interior) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int j = 0; j < S::NTW; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int key = key0 + warp_key + 8 * j + 2 * t4 + (e & 1);
                        const int p = pos[2 * mt + (e >> 1)];
                        if (key > p || key >= key_hi || (window > 0 && key <= p - window)) s[mt][j][e] = -PADDOCK_INF;
                    }
        }
#pragma unroll
        for (int i = 0; i < 2 * MT; ++i) {
            const int mt = i >> 1, e0 = 2 * (i & 1);
            float mx = -PADDOCK_INF;
#pragma unroll
            for (int j = 0; j < S::NTW; ++j) mx = fmaxf(mx, fmaxf(s[mt][j][e0], s[mt][j][e0 + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            float now = fmaxf(m[i], mx);
#if PF_LAZY > 0
            // The row's running max kept while the tile's is at most PF_LAZY above it: its exps stay <= 2^PF_LAZY
            // (float16 P holds them) and O is not rescaled, which past the first tiles is nearly always.
            if (m[i] != -PADDOCK_INF && now - m[i] <= (float)PF_LAZY) now = m[i];
#endif
            const float use = now == -PADDOCK_INF ? 0.f : now;
            const float alpha = fast_exp2(m[i] - use);
            m[i] = now;
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < S::NTW; ++j) {
                s[mt][j][e0] = fast_exp2(s[mt][j][e0] - use);
                s[mt][j][e0 + 1] = fast_exp2(s[mt][j][e0 + 1] - use);
                sum += s[mt][j][e0] + s[mt][j][e0 + 1];
            }
            l[i] = l[i] * alpha + sum;  // this lane's share; the row's four lanes meet at the end
            if (PF_LAZY == 0 || alpha != 1.f) {
#pragma unroll
                for (int d = 0; d < S::DT; ++d) {
                    o[mt][d][e0] *= alpha;
                    o[mt][d][e0 + 1] *= alpha;
                }
            }
        }

        // This tile's V: committed before the next K (and with PF_VBUF=2 the next V), which may stay in flight.
        if (more) cp_async_wait<PF_VBUF>(); else cp_async_wait<0>();
        __syncthreads();
        const u16* vb = sV + (PF_VBUF == 2 ? ((kt - kt0) & 1) * BN * S::LDV : 0);
#pragma unroll
        for (int kk = 0; kk < S::WK / 16; ++kk) {
            u32 a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                a[mt][0] = pack_h2_rn(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                a[mt][1] = pack_h2_rn(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                a[mt][2] = pack_h2_rn(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                a[mt][3] = pack_h2_rn(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
            const u16* vrow = vb + (warp_key + 16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8) * S::LDV + (lane >> 4) * 8;
#pragma unroll
            for (int np = 0; np < DV / 16; ++np) {
                u32 b[4];
                ldsm_x4_trans(b, vrow + 16 * np);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma_16816(o[mt][2 * np], a[mt], b);
                    mma_16816(o[mt][2 * np + 1], a[mt], b + 2);
                }
            }
        }
#if PF_VBUF == 1
        __syncthreads();  // every warp is done with V before the next one lands there
        if (more) {
            PF_LOAD_KV(D, DV, sV, v_cache, v_scale, table, key_lo + (kt + 1) * BN, key_hi, block_size, n_kv, kvh, tid,
                       col0);
            cp_async_commit();
        }
#endif
    }

#pragma unroll
    for (int i = 0; i < 2 * MT; ++i) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
#if PF_KEY_WARPS
    pf_combine_warps<D>(smem, m, l, o, warp, lane, tid, f0, rows, group, tile.q_start, n_heads, kvh, col0, split,
                        n_splits, part, sinks, out, part_o, part_ml);
#else
#pragma unroll
    for (int i = 0; i < 2 * MT; ++i) {
        const int f = fr[i], mt = i >> 1, e0 = 2 * (i & 1);
        if (f >= rows) continue;
        const size_t row = (size_t)(tile.q_start + f / group) * n_heads + kvh * group + f % group;
        if (n_splits == 1) {
            // A sink logit (nullable; GPT-OSS) joins the denominator, in the scores' log2 domain.
            const float den = sinks == nullptr ? l[i] : l[i] + fast_exp2(sinks[kvh * group + f % group] * PF_LOG2E - m[i]);
            const float inv = den > 0.f ? 1.f / den : 0.f;
            float* dst = out + row * D + col0 + 2 * t4;
#pragma unroll
            for (int d = 0; d < S::DT; ++d)
                *reinterpret_cast<float2*>(dst + 8 * d) = make_float2(o[mt][d][e0] * inv, o[mt][d][e0 + 1] * inv);
        } else {
            const size_t at = row * n_splits + split;
            float* dst = part_o + at * D + col0 + 2 * t4;
#pragma unroll
            for (int d = 0; d < S::DT; ++d)
                *reinterpret_cast<float2*>(dst + 8 * d) = make_float2(o[mt][d][e0], o[mt][d][e0 + 1]);
            if (t4 == 0 && part == 0) {  // every part has the same (max, sum)
                part_ml[2 * at] = m[i];
                part_ml[2 * at + 1] = l[i];
            }
        }
    }
#endif
}

// KV_FP8: the caches' block scales [num_blocks, n_kv] follow the float16 build's arguments.
#if PF_FP8
#define PF_SCALE_PARAMS , const float *__restrict__ k_scale, const float *__restrict__ v_scale
#define PF_SCALE_ARGS k_scale, v_scale
#else
#define PF_SCALE_PARAMS
#define PF_SCALE_ARGS nullptr, nullptr
#endif

#define ATTN_PREFILL_KERNEL(D)                                                                                  \
    extern "C" __global__ void __launch_bounds__(PF_WARPS * 32) attn_prefill_d##D(                              \
        const float* __restrict__ q, const pf_kv_t* __restrict__ k_cache, const pf_kv_t* __restrict__ v_cache, \
        const int* __restrict__ qsl, const int* __restrict__ seq_lens, const int* __restrict__ block_tables,   \
        int table_stride, int n_seqs, int n_heads, int n_kv, int block_size, float scale, float softcap,       \
        int window, float* __restrict__ out, float* __restrict__ part_o, float* __restrict__ part_ml,          \
        const int* __restrict__ key_limit, const float* __restrict__ sinks PF_SCALE_PARAMS) {                  \
        PADDOCK_DYNAMIC_SHARED(u16, pf_smem);                                                                   \
        after_previous_grid(); /* graphs launch it programmatically (pdl.py): q is the kernel before's */      \
        attn_prefill_body<D>(q, k_cache, v_cache, qsl, seq_lens, block_tables, table_stride, n_seqs, n_heads,  \
                             n_kv, block_size, scale, softcap, window, out, part_o, part_ml, key_limit, sinks, \
                             pf_smem, PF_SCALE_ARGS);                                                           \
    }

#if defined(PADDOCK_ALL_VARIANTS)
ATTN_PREFILL_KERNEL(64)
ATTN_PREFILL_KERNEL(128)
ATTN_PREFILL_KERNEL(256)
ATTN_PREFILL_KERNEL(512)
#else
#define ATTN_PREFILL_SELECTED(D) ATTN_PREFILL_KERNEL(D)  // one more expansion, so PF_D becomes its value
ATTN_PREFILL_SELECTED(PF_D)
#endif

// The splits of one (token, head) row combined: out = sum_z o_z 2^(m_z - M) / sum_z l_z 2^(m_z - M).
// One block per row, one thread per output element (head_dim >= 32). `extra_o` / `extra_lse` (nullable): one more
// part of the row, already normalised, with its natural-log sum of exponentials (a cascade decode's
// own keys, from attention_decode.cu): in the splits' log2 domain a split of max lse * log2 e and sum 1.
// `sinks` (nullable; GPT-OSS): head row % n_heads's sink logit joins the denominator.
// Warp 0 reads the splits' (max, sum) pairs, a lane each, and leaves their weights and the denominator in
// shared memory; then each thread's loads of its element over the splits are independent of each other. (When
// every thread walked the pairs one after another, a c=8 cascade's merge took 10.8 us a layer on the H100:
// bench/results/gpu-s28-2026-12-07.md.)
// attn_prefill_merge_h writes `out` in float16 (rounded to nearest even, as a cast would): a cascade decode's
// output before an output projection that reads float16 (cuda/linear.takes_half).
#define PF_MERGE_SPLITS 32  // attention_prefill.MAX_SPLITS: a lane of warp 0 per split
template <typename T>
__device__ __forceinline__ void attn_prefill_merge_body(const float* __restrict__ part_o,
                                                        const float* __restrict__ part_ml, int n_splits, int head_dim,
                                                        T* __restrict__ out, const float* __restrict__ extra_o,
                                                        const float* __restrict__ extra_lse,
                                                        const float* __restrict__ sinks, int n_heads) {
    __shared__ float weight_s[PF_MERGE_SPLITS + 2];  // 2^(m_z - M) of each split (0: no visible key), the extra
                                                     // part's, then the denominator
    after_previous_grid();  // the partials are the kernel before's; extra_o the one before it, which that one waited for
    const size_t row = blockIdx.x;
    const int d = threadIdx.x;
    if (threadIdx.x < 32) {
        const int z = threadIdx.x;
        const float* ml = part_ml + row * n_splits * 2;
        const float m = z < n_splits ? ml[2 * z] : -PADDOCK_INF;
        const float l = z < n_splits ? ml[2 * z + 1] : 0.f;
        const bool seen = l > 0.f;  // a split with no visible key wrote no output
        const float extra_m = extra_o == nullptr ? -PADDOCK_INF : extra_lse[row] * PF_LOG2E;
        const float big = warp_max(fmaxf(seen ? m : -PADDOCK_INF, extra_m));
        const float w = seen ? fast_exp2(m - big) : 0.f;
        float sum = warp_sum(seen ? l * w : 0.f);
        const float w_extra = extra_m != -PADDOCK_INF ? fast_exp2(extra_m - big) : 0.f;
        sum += w_extra;
        if (sinks != nullptr) sum += fast_exp2(sinks[row % n_heads] * PF_LOG2E - big);
        if (z < n_splits) weight_s[z] = w;
        if (z == 0) {
            weight_s[PF_MERGE_SPLITS] = w_extra;
            weight_s[PF_MERGE_SPLITS + 1] = sum;
        }
    }
    __syncthreads();
    const float* o = part_o + row * n_splits * head_dim + d;
    float acc = 0.f;
#pragma unroll 8
    for (int z = 0; z < n_splits; ++z) {
        const float w = weight_s[z];  // the same for every thread: a uniform branch, loads predicated
        acc += w != 0.f ? w * o[(size_t)z * head_dim] : 0.f;
    }
    const float w_extra = weight_s[PF_MERGE_SPLITS], sum = weight_s[PF_MERGE_SPLITS + 1];
    if (w_extra != 0.f) acc += w_extra * extra_o[row * head_dim + d];
    store_as(out, (i64)(row * head_dim + d), sum > 0.f ? acc / sum : 0.f);
}

#define ATTN_PREFILL_MERGE(NAME, T)                                                                                 \
    extern "C" __global__ void NAME(const float* __restrict__ part_o, const float* __restrict__ part_ml,           \
                                    int n_splits, int head_dim, T* __restrict__ out,                                \
                                    const float* __restrict__ extra_o, const float* __restrict__ extra_lse,         \
                                    const float* __restrict__ sinks, int n_heads) {                                 \
        attn_prefill_merge_body<T>(part_o, part_ml, n_splits, head_dim, out, extra_o, extra_lse, sinks, n_heads); \
    }
ATTN_PREFILL_MERGE(attn_prefill_merge, float)
ATTN_PREFILL_MERGE(attn_prefill_merge_h, u16)
