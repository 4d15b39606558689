// Paged attention for decode batches (one query token per sequence): the latency-bound case.
//
// Why a second kernel: at a few hundred keys a decode step's attention is not bytes but the
// chain of dependent memory round trips and barriers per block; attention.cu (built for
// mixed prefill batches) spends ~14 us there at 330 keys (docs/tuning-log.md), its
// value loads waiting on the softmax and its splits planned for the longest context. Here:
//
// - Grid (sequence, KV head, S blocks). The context is cut into chunks of KB keys; block b
//   takes chunks b, b + S, ... Only the first n_act = min(S, chunks) blocks have work, and
//   every block computes n_act from the context length, so idle blocks return at once and a
//   short context (one chunk) writes its output with no partials at all.
// - Per chunk: the chunk's cache slots (one block-table load per 16 keys), then every K and
//   V row of the chunk in one wave of 16-byte loads into shared memory, so values are read
//   while the scores are computed instead of after the softmax.
// - Scores: thread t takes key t % KB over a 1/P slice of head_dim for every head of the GQA
//   group; K rows are padded by one word so the 32 keys a warp reads sit in 32 banks.
//   Online softmax across a block's chunks, one warp per head.
// - Several active blocks: each writes (acc, max, sum); the last to finish merges them
//   (attn_merge.cuh).
// - sm_90+: the S blocks come in thread-block clusters of DEC_CLUSTER (the wrapper rounds S up to a
//   multiple). A cluster merges its blocks' partials through distributed shared memory
//   (dec_cluster_merge): a context of up to DEC_CLUSTER chunks writes its output with no global
//   partials, fence or count; a longer one merges one partial per cluster as above.
//
// - ATTN_ROPE=1 builds attn_dec_rope_*, which also does rope_cache.cu's work for the step's new
//   token (one launch less per layer at decode): it reads the projection's raw output
//   qkv [n_seqs, (n_heads + 2 n_kv) * D] instead of q. Every block normalizes and rotates its
//   group's q heads itself (G x D values: cheaper than a launch boundary); the one block whose chunk
//   holds the new key (position seq_len - 1) computes that key and value, stores them in the caches
//   and puts the float16-rounded row straight into its shared chunk (dec_rope_rows).
//
// K/V are float16 [num_blocks, block_size, n_kv, D]; q and out float32 [n_seqs, n_heads, D].
//
// - KV_FP8=1 builds read FP8 caches (fp8_kv.cuh's layout: e4m3 bytes of the same shape and a float32
//   scale per (block, KV head)) through the same float16 path: a chunk's loads are 8-byte units of
//   codes, stored into shared memory as the float16 of each value times 2^-8 (exact), and each key's
//   block scale (times 2^8) multiplies its score and, folded into its probability, its value. The
//   scales are powers of two, so the products come out as over the numpy backend's dequantized cache.
//   The kernel waits for the previous one before its first loads: the writer before it may have
//   raised a block's scale and re-encoded that block's older keys. No ATTN_ROPE build (a block's
//   scale depends on every key written to it: write_kv_fp8 does that).
#include "attn_merge.cuh"
#include "rope_pair.cuh"

#if defined(KV_FP8) && KV_FP8
#include "fp8_kv.cuh"
#define DEC_FP8 1
typedef u8 dec_kv_t;
typedef uint2 DecUnit;  // 8 codes: one 16-byte unit of the float16 rows in shared memory
__device__ __forceinline__ uint4 dec_unit_halves(uint2 c) { return e4m3x8_to_half2m8(c); }
#else
#define DEC_FP8 0
typedef u16 dec_kv_t;
typedef uint4 DecUnit;  // 8 halves
__device__ __forceinline__ uint4 dec_unit_halves(uint4 h) { return h; }
#endif

#define DEC_THREADS 128
#define DEC_WARPS 4

// DEC_OUT_HALF=1: `out` is float16 (each element rounded to nearest once, as a cast would round the float32
// output), for an output projection that reads float16 (cuBLAS on its weight's float16 copy), which would
// otherwise cast the output in a kernel of its own (attention_decode.py; cuda/linear.takes_half).
#if defined(DEC_OUT_HALF) && DEC_OUT_HALF
typedef u16 dec_out_t;
#else
typedef float dec_out_t;
#endif

// 1: a block's next chunk loads into registers while it computes this one (the loop below). Off by
// default until measured on a GPU: its 64 more registers leave 3 blocks per SM where the plain loop's
// 128 allowed 4 (PADDOCK_KERNEL_DEFINES=DEC_PREFETCH=1 for the A/B).
#ifndef DEC_PREFETCH
#define DEC_PREFETCH 0
#endif

// 1: the value loop of head dims >= 128 (one thread a dim) reads the probabilities four keys at a time (one
// 16-byte shared load a head, not four 4-byte ones). Nsight at 128 sequences x 256 keys (H100, 2026-12-07,
// bench/results/gpu-dattn-ncu-s27-2026-12-07.txt) puts the kernel at 76 % of L1's throughput and 54 % of DRAM's,
// and the value loop's probability loads were most of its shared-memory loads. The same sums in the same order.
// On since the H100 A/B of 2026-12-07 (bench/results/gpu-s28-2026-12-07.md): 32 sequences x 4,096 keys 224 -> 200 us,
// 128 x 256 66.4 -> 64.7 us; the engine's decode step at 32 sequences 6.30 -> 6.24 ms. DEC_PVEC=0: the plain loop.
#ifndef DEC_PVEC
#define DEC_PVEC 1
#endif

// Blocks per cluster along grid z: ATTN_CL from the wrapper (attention_decode.block_layout), 8 when
// not given (the compile test); 1 below sm_90 and in the host builds, which keep the global merge.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#ifndef ATTN_CL
#define ATTN_CL 8
#endif
#define DEC_CLUSTER ATTN_CL
#else
#define DEC_CLUSTER 1
#endif
static_assert(DEC_CLUSTER == 1 || DEC_CLUSTER == 2 || DEC_CLUSTER == 4 || DEC_CLUSTER == 8,
              "a cluster is 1, 2, 4 or 8 blocks (8: the portable maximum)");

template <int D, int GMAX>
struct DecShape {
    static constexpr int KB = D <= 128 ? 64 : 32;   // keys per chunk
    static constexpr int P = DEC_THREADS / KB;      // threads per key in the score phase
    static constexpr int DS = D / P;                // head_dim slice of a score thread
    static constexpr int KROW = D + 2;              // halves per K row in shared memory (one word of pad)
    static constexpr int VT = D < DEC_THREADS ? DEC_THREADS / D : 1;  // threads per output dim
    static constexpr int DPT = D > DEC_THREADS ? D / DEC_THREADS : 1;  // output dims per thread
    static constexpr int UNITS = KB * D / 8;         // 16-byte loads per chunk, K or V
};

// A block's partial as its cluster reads it (sm_90+): max and sum per head, then the group's
// unnormalised output rows, in floats over k_s (free once the last chunk's scores are computed).
template <int D, int GMAX>
struct DecStage {
    static constexpr int M = 0, L = GMAX, ACC = 2 * GMAX;  // offsets in floats
    static constexpr int FLOATS = ACC + GMAX * D;
    static_assert(FLOATS * 4 <= DecShape<D, GMAX>::KB * DecShape<D, GMAX>::KROW * 2, "the stage fits in k_s");
};

// 8 halves of K row `row` at column unit `col`: rows are padded by one word (DecShape::KROW), so
// only 4-byte alignment holds.
template <int D, int GMAX>
__device__ __forceinline__ void dec_store_k(u16* k_s, int row, int col, uint4 v) {
    u32* kd = reinterpret_cast<u32*>(k_s + row * DecShape<D, GMAX>::KROW + col * 8);
    kd[0] = v.x;
    kd[1] = v.y;
    kd[2] = v.z;
    kd[3] = v.w;
}

// A chunk's K and V rows on their way from the cache to shared memory: each thread's share of
// the chunk's 16-byte units, held in registers between dec_issue_chunk and dec_store_chunk.
template <int D, int GMAX>
struct DecChunkRegs {
    static constexpr int PER_THREAD = DecShape<D, GMAX>::UNITS / DEC_THREADS;
    DecUnit k[PER_THREAD], v[PER_THREAD];
};

// The cache slots of the chunk from key k0 into slot_s (-1 outside [lo, pos]): one block-table
// load per key of the chunk, by the first KB threads. Readers wait for a barrier.
template <int D, int GMAX>
__device__ __forceinline__ void dec_chunk_slots(const int* __restrict__ table, int block_size, int k0, int lo, int pos,
                                                int* slot_s) {
    const int tid = threadIdx.x;
    if (tid < DecShape<D, GMAX>::KB) {
        const int key = k0 + tid;
        slot_s[tid] = key >= lo && key <= pos ? table[key / block_size] * block_size + key % block_size : -1;
    }
}

#if DEC_FP8
// KV_FP8: the chunk's K and V block scales per key (times 2^8: see the top), from the slots the same
// threads just wrote (dec_chunk_slots); 0 for a masked key.
template <int D, int GMAX>
__device__ __forceinline__ void dec_chunk_scales(const int* slot_s, int block_size, const float* __restrict__ k_scale,
                                                 const float* __restrict__ v_scale, int n_kv, int g,
                                                 float (*kvs_s)[DecShape<D, GMAX>::KB]) {
    const int tid = threadIdx.x;
    if (tid < DecShape<D, GMAX>::KB) {
        const int slot = slot_s[tid];
        const i64 i = (i64)(slot / block_size) * n_kv + g;
        kvs_s[0][tid] = slot >= 0 ? k_scale[i] * E4M3_HALF_UNSCALE : 0.f;
        kvs_s[1][tid] = slot >= 0 ? v_scale[i] * E4M3_HALF_UNSCALE : 0.f;
    }
}
#endif

// Every K and V load of the chunk from key k0 (its slots in slot_s), issued at once into registers:
// the loads of the next chunk stay in flight while this one's scores, softmax and values are
// computed (the kernel's one source of memory-level parallelism beyond its resident blocks). Key
// `skip` (if in the chunk) is left out: dec_load_key or dec_put_new_token writes its row.
template <int D, int GMAX>
__device__ __forceinline__ void dec_issue_chunk(const int* slot_s, int k0, int skip, const dec_kv_t* __restrict__ k_head,
                                                const dec_kv_t* __restrict__ v_head, i64 kv_row,
                                                DecChunkRegs<D, GMAX>& r) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int j = 0; j < DecChunkRegs<D, GMAX>::PER_THREAD; ++j) {
        const int u = tid + j * DEC_THREADS, row = u / (D / 8), col = u % (D / 8);
        const int slot = slot_s[row];
        if (slot >= 0 && k0 + row != skip) {
            const i64 off = slot * kv_row + col * 8;
            r.k[j] = __ldg(reinterpret_cast<const DecUnit*>(k_head + off));
            r.v[j] = __ldg(reinterpret_cast<const DecUnit*>(v_head + off));
        } else {
            r.k[j] = DecUnit{};
            r.v[j] = r.k[j];
        }
    }
}

// The registers of dec_issue_chunk into the chunk's shared rows (k_s and v_s free: after a barrier
// that follows their last reads), but for row `skip`, which another thread writes.
template <int D, int GMAX>
__device__ __forceinline__ void dec_store_chunk(int k0, int skip, const DecChunkRegs<D, GMAX>& r, u16* k_s,
                                                u16* v_s) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int j = 0; j < DecChunkRegs<D, GMAX>::PER_THREAD; ++j) {
        const int u = tid + j * DEC_THREADS, row = u / (D / 8), col = u % (D / 8);
        if (k0 + row == skip) continue;
        dec_store_k<D, GMAX>(k_s, row, col, dec_unit_halves(r.k[j]));
        reinterpret_cast<uint4*>(v_s)[u] = dec_unit_halves(r.v[j]);
    }
}

// K and V row `row` of the chunk in shared memory (its slot in slot_s).
template <int D, int GMAX>
__device__ __forceinline__ void dec_load_key(int row, const int* slot_s, const dec_kv_t* __restrict__ k_head,
                                             const dec_kv_t* __restrict__ v_head, i64 kv_row, u16* k_s, u16* v_s) {
    const int slot = slot_s[row];
    for (int col = threadIdx.x; col < D / 8 && slot >= 0; col += DEC_THREADS) {
        const i64 off = slot * kv_row + col * 8;
        dec_store_k<D, GMAX>(k_s, row, col, dec_unit_halves(__ldcg(reinterpret_cast<const DecUnit*>(k_head + off))));
        reinterpret_cast<uint4*>(v_s)[row * (D / 8) + col] =
            dec_unit_halves(__ldcg(reinterpret_cast<const DecUnit*>(v_head + off)));
    }
}

// The block's final (acc, max, sum) per head of the group into its stage, for its cluster to read.
template <int D, int GMAX>
__device__ __forceinline__ void dec_stage_partial(float* stage, const float (&acc)[DecShape<D, GMAX>::DPT][GMAX],
                                                  const float* m_s, const float* l_s, int group) {
    typedef DecStage<D, GMAX> St;
    constexpr int DPT = DecShape<D, GMAX>::DPT;
    const int tid = threadIdx.x;
    if (tid < D || DPT > 1) {  // threads holding a final dim sum
#pragma unroll
        for (int h = 0; h < GMAX; ++h) {
            if (h >= group) continue;
#pragma unroll
            for (int j = 0; j < DPT; ++j) stage[St::ACC + h * D + tid % D + j * DEC_THREADS] = acc[j][h];
        }
    }
    if (tid < group) {
        stage[St::M + tid] = m_s[tid];
        stage[St::L + tid] = l_s[tid];
    }
}

#if DEC_CLUSTER > 1
struct DecPartial {
    float acc, m, l;  // unnormalised output element, max and sum of its head
};

// Element e of the group's [group][D] output (head e / D) merged over the stages of ranks 0 .. n-1
// of this cluster, by attn_merge_splits' formula: weights exp(m_r - max), denominator sum w_r * l_r,
// summed in rank order. Every load is issued before the first use (one round trip over the cluster).
template <int D, int GMAX>
__device__ __forceinline__ DecPartial dec_merge_ranks(const float* stage, int n, int e) {
    typedef DecStage<D, GMAX> St;
    const int h = e / D;
    float m[DEC_CLUSTER], l[DEC_CLUSTER], x[DEC_CLUSTER];
#pragma unroll
    for (int r = 0; r < DEC_CLUSTER; ++r) {
        m[r] = -PADDOCK_INF;
        l[r] = x[r] = 0.f;
        if (r < n) {
            const float* s = cluster_map_shared(stage, r);
            m[r] = s[St::M + h];
            l[r] = s[St::L + h];
            x[r] = s[St::ACC + e];
        }
    }
    float mx = -PADDOCK_INF;
#pragma unroll
    for (int r = 0; r < DEC_CLUSTER; ++r) mx = fmaxf(mx, m[r]);
    DecPartial p = {0.f, mx, 0.f};
#pragma unroll
    for (int r = 0; r < DEC_CLUSTER; ++r) {
        const float w = m[r] == -PADDOCK_INF ? 0.f : expf(m[r] - mx);  // also the ranks past n
        p.acc = fmaf(w, x[r], p.acc);
        p.l = fmaf(w, l[r], p.l);
    }
    return p;
}

// The end of every block of a cluster with active blocks, idle ones included (a cluster barrier
// waits for every thread of the cluster that has not exited), after dec_stage_partial. The cluster's
// threads share out the group's output elements: thread t of rank r takes elements
// r * DEC_THREADS + t + i * DEC_CLUSTER * DEC_THREADS, each merged over the stages of the cluster's
// active blocks. With one cluster active those are the output; with several, cluster c writes its
// merge as partial c, and the last block to count merges the clusters' partials (attn_merge_splits).
// A block's rank is blockIdx.z % DEC_CLUSTER: clusters are (1, 1, DEC_CLUSTER) blocks, ranked along z.
template <int D, int GMAX>
__device__ __forceinline__ void dec_cluster_merge(const float* stage, int group, int n_act, i64 row0,
                                                  dec_out_t* __restrict__ out, float* __restrict__ part_acc,
                                                  float* __restrict__ part_m, float* __restrict__ part_l,
                                                  int* count, float* wgt, float* den, int* flag,
                                                  float* __restrict__ lse_out, const float* __restrict__ sinks) {
    constexpr int STEP = DEC_CLUSTER * DEC_THREADS;       // elements per pass of the cluster's threads
    constexpr int ITEMS = (GMAX * D + STEP - 1) / STEP;  // passes
    const int b = blockIdx.z, n_blocks = gridDim.z, rank = b % DEC_CLUSTER, cluster = b / DEC_CLUSTER;
    const int n_ranks = min(DEC_CLUSTER, n_act - (b - rank));  // active blocks of this cluster
    const int n_clusters = (n_act + DEC_CLUSTER - 1) / DEC_CLUSTER;
    const int n_elems = group * D;

    cluster_sync();  // every block's stage is written
    DecPartial p[ITEMS];
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const int e = rank * DEC_THREADS + threadIdx.x + i * STEP;
        if (e < n_elems) p[i] = dec_merge_ranks<D, GMAX>(stage, n_ranks, e);
    }
    cluster_arrive();  // this block has read the others' stages (they wait for it before exiting)
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const int e = rank * DEC_THREADS + threadIdx.x + i * STEP;
        if (e >= n_elems) continue;
        const i64 row = row0 + e / D;
        const int d = e % D;
        if (n_clusters == 1) {
            const float den = attn_denominator(p[i].m, p[i].l, sinks, e / D);
            store_as(out, row * D + d, den > 0.f ? p[i].acc / den : 0.f);
            if (d == 0 && lse_out != nullptr) lse_out[row] = attn_lse(p[i].m, p[i].l);
        } else {
            part_acc[(row * n_blocks + cluster) * D + d] = p[i].acc;
            if (d == 0) {
                part_m[row * n_blocks + cluster] = p[i].m;
                part_l[row * n_blocks + cluster] = p[i].l;
            }
        }
    }
    cluster_wait();  // no block exits while another may still read its stage
    // Blocks that wrote a share of a partial count themselves in; the last merges the clusters'.
    const int writers = min(DEC_CLUSTER, (n_elems + DEC_THREADS - 1) / DEC_THREADS);
    if (n_clusters == 1 || rank >= writers) return;
    if (!attn_last_to_finish(count, n_clusters * writers, flag)) return;
    attn_merge_splits<D>(part_acc, part_m, part_l, row0, group, n_blocks, 0, n_clusters, wgt, n_clusters, den, out,
                         lse_out, sinks);
}
#endif

// -- rope_cache's work inside the kernel (ATTN_ROPE) ----------------------------------------------

// rope_cache.cu's inputs beyond the projection output.
struct DecRope {
    const float* q_norm;  // QK-norm weights [D], both or neither (null: no QK-norm)
    const float* k_norm;
    float eps;
    const int* positions;  // [n_seqs]: the rotation's position of each token
    const float* cos_t;    // [max_pos, rot_half]: rot_half < D / 2 turns the first 2 rot_half dims only
    const float* sin_t;
    int max_pos, rot_half, interleaved;
    const int* slots;  // [n_seqs]: the new token's cache slot; < 0 (padding): nothing stored
    u16* k_store;      // the caches, to write the new token's k and v (the body only reads k_cache, v_cache)
    u16* v_store;
};

// One thread's share of the new token's rows: pair threadIdx.x % (D/2) of each, and in the threads
// that computed them the new key's and value's pair as the cache holds them.
struct DecNewToken {
    RopePair p;
    float wqa, wqb, wka, wkb;  // the pair's QK-norm weights, 1 without
    int slot;
    u32 k, v;   // float16 pairs (low half: dim p.a, high: p.b)
    bool held;  // k and v are this thread's (only in the block that owns the new key)
};

// Before the wait for the previous kernel: what rope_cache also reads then, the step's positions and
// slots (written by the host before the step) and constants (norm weights, rotation tables).
template <int D>
__device__ __forceinline__ DecNewToken dec_rope_inputs(const DecRope& r, int seq) {
    const int i = threadIdx.x % (D / 2);
    DecNewToken n;
    n.p = rope_pair(i, D, r.rot_half, r.interleaved);
    rope_angle(n.p, i, r.rot_half, r.positions[seq], r.cos_t, r.sin_t, r.max_pos);
    n.wqa = n.wqb = n.wka = n.wkb = 1.f;
    if (r.q_norm != nullptr) {
        n.wqa = r.q_norm[n.p.a];
        n.wqb = r.q_norm[n.p.b];
        n.wka = r.k_norm[n.p.a];
        n.wkb = r.k_norm[n.p.b];
    }
    n.slot = r.slots[seq];
    n.k = n.v = 0u;
    n.held = false;
    return n;
}

// After the wait, rope_cache's work for this block (its formulas: rope_pair.cuh). Rows 0 .. GMAX - 1
// are the group's q heads, normalized, rotated and times `scale` into q_s (rows past the group zero,
// as the q path writes them); row GMAX, in the block that owns the new key only, is KV head g's k.
// That block stores k and v in the caches at the token's slot and keeps their float16 pairs in the
// computing threads (dec_put_new_token puts them in the chunk). No thread of the kernel reads that
// cache entry (every chunk load skips it, and other blocks' chunks do not hold it), so the stores
// need no fence or barrier, and the read-only (__ldg) loads of the cache never see a line change:
// a slot's row of one KV head is D halves, whole 32-byte sectors.
//
// Thread t takes pair t % (D/2) of rows t / (D/2) + HP * pass. A row is D/64 whole warps, so its sum
// of squares is a warp sum per warp, then the warps' sums added from 0 in warp order: block_sum's
// order in rope_cache, whose block is one row's D/2 threads, so q and k come out as rope_cache's
// (the same operations in the same order). Every row's values are loaded before the first sum (one
// round trip to the projection output for all of them).
template <int D, int GMAX>
__device__ __forceinline__ void dec_rope_rows(const float* __restrict__ qkv, const DecRope& r, DecNewToken& n,
                                              int seq, int g, int n_heads, int n_kv, int group, bool owner,
                                              float scale, float (*q_s)[D]) {
    constexpr int HALF = D / 2, HP = DEC_THREADS / HALF, WPH = HALF / 32;
    constexpr int PASSES = (GMAX + 1 + HP - 1) / HP, K_PASS = GMAX / HP;  // the k row: GMAX
    static_assert(HALF % 32 == 0 && DEC_THREADS % HALF == 0, "a row's pairs fill whole warps of the block");
    __shared__ float squares[PASSES][DEC_WARPS];
    const int tid = threadIdx.x, warp = tid >> 5, in_pass = tid / HALF;
    const float* tok = qkv + (i64)seq * (n_heads + 2 * n_kv) * D;
    const bool norm = r.q_norm != nullptr;
    const bool k_thread = owner && in_pass == GMAX % HP;  // it also takes the v pair
    float x1[PASSES], x2[PASSES], v1 = 0.f, v2 = 0.f;
#pragma unroll
    for (int ps = 0; ps < PASSES; ++ps) {
        const int row = ps * HP + in_pass;
        const float* src = row < group ? tok + (i64)(g * group + row) * D : tok + (i64)(n_heads + g) * D;
        x1[ps] = x2[ps] = 0.f;
        if (row < group || (row == GMAX && owner)) {
            x1[ps] = src[n.p.a];
            x2[ps] = src[n.p.b];
        }
    }
    if (k_thread) {
        const float* v_src = tok + (i64)(n_heads + n_kv + g) * D;
        v1 = v_src[n.p.a];
        v2 = v_src[n.p.b];
    }
    if (norm) {
#pragma unroll
        for (int ps = 0; ps < PASSES; ++ps) {
            if (ps * HP >= group && !(owner && ps == K_PASS)) continue;  // no row of it is used (uniform)
            const float sum = warp_sum(rope_pair_squares(x1[ps], x2[ps]));
            if ((tid & 31) == 0) squares[ps][warp] = sum;
        }
        __syncthreads();
    }
#pragma unroll
    for (int ps = 0; ps < PASSES; ++ps) {
        const int row = ps * HP + in_pass;
        if (row >= group && row < GMAX) q_s[row][n.p.a] = q_s[row][n.p.b] = 0.f;
        if (!(row < group || (row == GMAX && owner))) continue;
        float head_squares = 0.f;
        if (norm) {
#pragma unroll
            for (int w = 0; w < WPH; ++w) head_squares += squares[ps][in_pass * WPH + w];
        }
        const bool is_k = row == GMAX;
        rope_norm_rotate(x1[ps], x2[ps], norm, head_squares, D, r.eps, is_k ? n.wka : n.wqa, is_k ? n.wkb : n.wqb,
                         n.p);
        if (!is_k) {
            q_s[row][n.p.a] = x1[ps] * scale;
            q_s[row][n.p.b] = x2[ps] * scale;
            continue;
        }
        n.k = pack_h2(x1[ps], x2[ps]);
        n.v = pack_h2(v1, v2);
        n.held = true;
        if (n.slot >= 0) {
            const i64 off = n.slot * ((i64)n_kv * D) + (i64)g * D;
            r.k_store[off + n.p.a] = (u16)(n.k & 0xffffu);
            r.k_store[off + n.p.b] = (u16)(n.k >> 16);
            r.v_store[off + n.p.a] = (u16)(n.v & 0xffffu);
            r.v_store[off + n.p.b] = (u16)(n.v >> 16);
        }
    }
}

// The new key's row `row` of the chunk in shared memory, from the threads that hold it (after
// dec_store_chunk, which left that row to this, and before the barrier that precedes the scores).
template <int D, int GMAX>
__device__ __forceinline__ void dec_put_new_token(const DecNewToken& n, int row, u16* k_s, u16* v_s) {
    if (!n.held) return;
    u16* k_row = k_s + row * DecShape<D, GMAX>::KROW;
    k_row[n.p.a] = (u16)(n.k & 0xffffu);
    k_row[n.p.b] = (u16)(n.k >> 16);
    v_s[row * D + n.p.a] = (u16)(n.v & 0xffffu);
    v_s[row * D + n.p.b] = (u16)(n.v >> 16);
}

// -- the kernel ------------------------------------------------------------------------------------

// ROPE: the ATTN_ROPE build, `q` is then the projection output qkv and `rope` rope_cache's inputs
// (unused otherwise).
template <int D, int GMAX, bool ROPE>
__device__ __forceinline__ void attn_decode_body(const float* __restrict__ q, const dec_kv_t* __restrict__ k_cache,
                                                 const dec_kv_t* __restrict__ v_cache, const int* __restrict__ seq_lens,
                                                 const int* __restrict__ block_tables, int table_stride, int n_heads,
                                                 int n_kv, int block_size, float scale, float softcap, int window,
                                                 dec_out_t* __restrict__ out, float* __restrict__ part_acc,
                                                 float* __restrict__ part_m, float* __restrict__ part_l,
                                                 int* __restrict__ counters, const int* __restrict__ key_floor,
                                                 float* __restrict__ lse_out, const float* __restrict__ sinks,
                                                 const DecRope& rope, const float* __restrict__ k_scale,
                                                 const float* __restrict__ v_scale) {
    typedef DecShape<D, GMAX> S;
    __shared__ __align__(16) u16 k_s[S::KB * S::KROW];
    __shared__ __align__(16) u16 v_s[S::KB * D];
    __shared__ __align__(16) float q_s[GMAX][D];
    __shared__ __align__(16) float sc[S::P][GMAX][S::KB];  // partial scores; part 0 ends as the probabilities
    __shared__ int slot_s[2][S::KB];  // the chunk in k_s / v_s, and the one loading (parity of the chunk's turn)
#if DEC_FP8
    __shared__ float kvs_s[2][2][S::KB];  // KV_FP8: per turn as slot_s, the keys' K then V scales
#endif
    __shared__ float m_s[GMAX], l_s[GMAX], alpha_s[GMAX];
    __shared__ int last_block;

    const int seq = blockIdx.x, g = blockIdx.y, b = blockIdx.z, n_blocks = gridDim.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int group = n_heads / n_kv, head0 = g * group;
    const float* group_sinks = sinks == nullptr ? nullptr : sinks + head0;  // sink logits (nullable: none)

    // Before the wait for the previous kernel (pdl.py): the context length, the block table and
    // every K/V row of this block's first chunk except the newest key, which the kernel before
    // (rope_cache) is writing, or with ROPE this kernel. Lengths and tables are inputs of the step
    // that no kernel of the step writes; older keys were written by earlier steps.
    const int ctx = seq_lens[seq];  // a padding row of a graph bucket has 0: its output is 0
    const int pos = ctx - 1;
    // key_floor (nullable): keys below *key_floor are another launch's (a cascade decode's shared prefix).
    const int key_min = key_floor == nullptr ? 0 : key_floor[0];
    const int lo = max(key_min, window > 0 ? max(0, pos - window + 1) : 0);
    const int first_chunk = lo / S::KB;
    const int n_chunks = ctx > 0 ? pos / S::KB - first_chunk + 1 : 0;
    const int n_act = max(1, min(n_blocks, n_chunks));
    // A block past the active ones returns at once (uniform over the block, before any barrier),
    // except in a cluster that merges in shared memory: there it takes part in the cluster's barriers.
    // A cluster with no active block returns as a whole.
    const bool in_merging_cluster = DEC_CLUSTER > 1 && n_act > 1 && b - b % DEC_CLUSTER < n_act;
    if (b >= n_act && !in_merging_cluster) return;

    if (tid < GMAX) {
        m_s[tid] = -PADDOCK_INF;
        l_s[tid] = 0.f;
    }
    float acc[S::DPT][GMAX];
#pragma unroll
    for (int j = 0; j < S::DPT; ++j)
#pragma unroll
        for (int h = 0; h < GMAX; ++h) acc[j][h] = 0.f;

    const int* table = block_tables + (i64)seq * table_stride;
    const i64 kv_row = (i64)n_kv * D;
    const dec_kv_t* k_head = k_cache + (i64)g * D;
    const dec_kv_t* v_head = v_cache + (i64)g * D;
    int c = first_chunk + b;
    const bool any = ctx > 0 && c <= pos / S::KB;
    // ROPE: the block whose chunks include the new key's (the context's last) computes and stores the
    // new k and v; with no context (a padding row) block 0 stores them, as rope_cache would.
    const bool owner = ctx > 0 ? (pos / S::KB - first_chunk) % n_blocks == b : b == 0;
    DecNewToken fresh;
    if constexpr (ROPE) fresh = dec_rope_inputs<D>(rope, seq);
    const int last = pos / S::KB;  // the context's last chunk
    // Chunk `chunk`'s cache slots into slot_s[t], and with KV_FP8 its keys' scales into kvs_s[t] (by the
    // same threads, so no barrier between); readers wait for a barrier.
    auto chunk_slots = [&](int chunk, int t) {
        dec_chunk_slots<D, GMAX>(table, block_size, chunk * S::KB, lo, pos, slot_s[t]);
#if DEC_FP8
        dec_chunk_scales<D, GMAX>(slot_s[t], block_size, k_scale, v_scale, n_kv, g, kvs_s[t]);
#endif
    };
#if DEC_FP8
    after_previous_grid();  // the writer may have re-encoded older keys of the newest key's block
#endif
    if (any) {
        chunk_slots(c, 0);
        if (DEC_PREFETCH && c + n_blocks <= last) chunk_slots(c + n_blocks, 1);
        __syncthreads();
        DecChunkRegs<D, GMAX> first;
        dec_issue_chunk<D, GMAX>(slot_s[0], c * S::KB, pos, k_head, v_head, kv_row, first);
        dec_store_chunk<D, GMAX>(c * S::KB, pos, first, k_s, v_s);
    }
#if !DEC_FP8
    after_previous_grid();
#endif
    if constexpr (ROPE) {
        if (any || owner) dec_rope_rows<D, GMAX>(q, rope, fresh, seq, g, n_heads, n_kv, group, owner, scale, q_s);
    } else {
        for (int i = tid; i < GMAX * D; i += DEC_THREADS) {
            const int h = i / D, d = i % D;
            q_s[h][d] = h < group ? q[((i64)seq * n_heads + head0 + h) * D + d] * scale : 0.f;
        }
        if (any && last == c) dec_load_key<D, GMAX>(pos - c * S::KB, slot_s[0], k_head, v_head, kv_row, k_s, v_s);
    }

    // Chunk c is in k_s / v_s with its slots in slot_s[turn]. With DEC_PREFETCH, chunk c + n_blocks, if
    // any, loads into registers while c is computed and is stored after c's values are read; without,
    // each chunk after the first loads at the top of its turn. With ROPE the new key is never read from
    // the cache (this kernel is writing it); without, the kernel before wrote it.
    const int skip = ROPE ? pos : -1;
    for (int turn = 0; any && c <= last; c += n_blocks, turn ^= DEC_PREFETCH) {
        const bool more = DEC_PREFETCH && c + n_blocks <= last;  // uniform over the block, as barriers need
        if (!DEC_PREFETCH && c != first_chunk + b) {
            __syncthreads();  // the previous chunk's k_s, v_s, probabilities and slots are read
            chunk_slots(c, 0);
            __syncthreads();
            DecChunkRegs<D, GMAX> now;
            dec_issue_chunk<D, GMAX>(slot_s[0], c * S::KB, skip, k_head, v_head, kv_row, now);
            dec_store_chunk<D, GMAX>(c * S::KB, skip, now, k_s, v_s);
        }
        if constexpr (ROPE) {
            if (c == last) dec_put_new_token<D, GMAX>(fresh, pos - c * S::KB, k_s, v_s);
        }
        __syncthreads();  // k_s, v_s, the slot rows, q_s and the softmax state are written
        DecChunkRegs<D, GMAX> next;
        if (more) dec_issue_chunk<D, GMAX>(slot_s[turn ^ 1], (c + n_blocks) * S::KB, skip, k_head, v_head, kv_row, next);
        const int* slots = slot_s[turn];
#if DEC_FP8
        const float* k_sc = kvs_s[turn][0];
        const float* v_sc = kvs_s[turn][1];
#endif

        // Scores: key t % KB, slice t / KB of head_dim, every head of the group.
        {
            const int kk = tid % S::KB, part = tid / S::KB;
            const u32* kp = reinterpret_cast<const u32*>(k_s + kk * S::KROW + part * S::DS);
            float dot[GMAX];
#pragma unroll
            for (int h = 0; h < GMAX; ++h) dot[h] = 0.f;
#pragma unroll 4
            for (int e = 0; e < S::DS; e += 4) {
                const u32 w0 = kp[e / 2], w1 = kp[e / 2 + 1];
                const float k0f = h2f_lo(w0), k1f = h2f_hi(w0), k2f = h2f_lo(w1), k3f = h2f_hi(w1);
#pragma unroll
                for (int h = 0; h < GMAX; ++h) {
                    const float4 qv = *reinterpret_cast<const float4*>(&q_s[h][part * S::DS + e]);
                    dot[h] = fmaf(qv.x, k0f, fmaf(qv.y, k1f, fmaf(qv.z, k2f, fmaf(qv.w, k3f, dot[h]))));
                }
            }
#pragma unroll
            for (int h = 0; h < GMAX; ++h) sc[part][h][kk] = dot[h];
        }
        __syncthreads();

        // Online softmax over the chunk, one warp per head; masked keys (slot -1) weigh nothing.
        for (int h = warp; h < group; h += DEC_WARPS) {
            float s_k[S::KB / 32];
            float mx = -PADDOCK_INF;
#pragma unroll
            for (int i = 0; i < S::KB / 32; ++i) {
                const int kk = lane + 32 * i;
                float s = sc[0][h][kk];
#pragma unroll
                for (int p = 1; p < S::P; ++p) s += sc[p][h][kk];
#if DEC_FP8
                s *= k_sc[kk];
#endif
                if (softcap > 0.f) s = softcap * tanhf(s / softcap);
                s = slots[kk] >= 0 ? s : -PADDOCK_INF;
                s_k[i] = s;
                mx = fmaxf(mx, s);
            }
            mx = warp_max(mx);
            const float m_old = m_s[h];
            const float m_new = fmaxf(m_old, mx);
            float sum = 0.f;
#pragma unroll
            for (int i = 0; i < S::KB / 32; ++i) {
                const float p = s_k[i] == -PADDOCK_INF ? 0.f : expf(s_k[i] - m_new);
#if DEC_FP8
                sc[0][h][lane + 32 * i] = p * v_sc[lane + 32 * i];  // the value's scale, folded in
#else
                sc[0][h][lane + 32 * i] = p;
#endif
                sum += p;
            }
            sum = warp_sum(sum);
            if (lane == 0) softmax_fold(h, m_new, sum, m_s, l_s, alpha_s);
        }
        __syncthreads();

        // Values: dims tid % D (+ 128 j), keys of this thread's share (VT threads per dim).
#pragma unroll
        for (int h = 0; h < GMAX; ++h) {
            const float a = h < group ? alpha_s[h] : 0.f;
#pragma unroll
            for (int j = 0; j < S::DPT; ++j) acc[j][h] *= a;
        }
        if constexpr (DEC_PVEC && S::VT == 1) {
            // Four keys at a time: each head's four probabilities in one 16-byte load (a broadcast: every
            // thread reads the same ones). Each sum takes its keys in the same order as below: the same result.
            const int d0 = tid % D;
#pragma unroll 4
            for (int k4 = 0; k4 < S::KB; k4 += 4) {
                float4 p[GMAX];
#pragma unroll
                for (int h = 0; h < GMAX; ++h) p[h] = *reinterpret_cast<const float4*>(&sc[0][h][k4]);
#pragma unroll
                for (int j = 0; j < S::DPT; ++j) {
                    const u16* vp = v_s + k4 * D + d0 + j * DEC_THREADS;
                    const float v0 = h2f(vp[0]), v1 = h2f(vp[D]), v2 = h2f(vp[2 * D]), v3 = h2f(vp[3 * D]);
#pragma unroll
                    for (int h = 0; h < GMAX; ++h) {
                        float a = fmaf(p[h].x, v0, acc[j][h]);
                        a = fmaf(p[h].y, v1, a);
                        a = fmaf(p[h].z, v2, a);
                        acc[j][h] = fmaf(p[h].w, v3, a);
                    }
                }
            }
        } else {
            const int d0 = tid % D, kpart = tid / D;  // kpart < VT
#pragma unroll 4
            for (int kk = kpart; kk < S::KB; kk += S::VT) {
#pragma unroll
                for (int j = 0; j < S::DPT; ++j) {
                    const float v = h2f(v_s[kk * D + d0 + j * DEC_THREADS]);
#pragma unroll
                    for (int h = 0; h < GMAX; ++h) acc[j][h] = fmaf(sc[0][h][kk], v, acc[j][h]);
                }
            }
        }
        if (more) {
            __syncthreads();  // chunk c's k_s, v_s, probabilities and slots are read
            dec_store_chunk<D, GMAX>((c + n_blocks) * S::KB, skip, next, k_s, v_s);
            if (c + 2 * n_blocks <= last) chunk_slots(c + 2 * n_blocks, turn);
        }
    }
    __syncthreads();  // the last chunk's probabilities are read; sc is free for the sum below

    // Threads sharing a dim (VT > 1) add their sums in shared memory, in a fixed order.
    float* red = &sc[0][0][0];  // P * GMAX * KB >= VT * GMAX * D floats
    if constexpr (S::VT > 1) {
#pragma unroll
        for (int h = 0; h < GMAX; ++h) red[(tid / D) * GMAX * D + h * D + tid % D] = acc[0][h];
        __syncthreads();
        if (tid < D) {
#pragma unroll
            for (int h = 0; h < GMAX; ++h) {
                float s = red[h * D + tid];
#pragma unroll
                for (int p = 1; p < S::VT; ++p) s += red[p * GMAX * D + h * D + tid];
                acc[0][h] = s;
            }
        }
    }
    const bool writer = tid < D || S::DPT > 1;  // threads holding a final dim sum
    if (n_act == 1) {
        if (writer) {
#pragma unroll
            for (int h = 0; h < GMAX; ++h) {
                if (h >= group) continue;
                const float l = l_s[h], den = attn_denominator(m_s[h], l, group_sinks, h);
#pragma unroll
                for (int j = 0; j < S::DPT; ++j)
                    store_as(out, ((i64)seq * n_heads + head0 + h) * D + tid % D + j * DEC_THREADS,
                             den > 0.f ? acc[j][h] / den : 0.f);
                if (tid == 0 && lse_out != nullptr) lse_out[(i64)seq * n_heads + head0 + h] = attn_lse(m_s[h], l);
            }
        }
        return;
    }
#if DEC_CLUSTER > 1
    // The cluster merges in shared memory (the stages over k_s); with several clusters, the last
    // block's merge keeps one weight per cluster and head in sc and the denominators in l_s.
    dec_stage_partial<D, GMAX>(reinterpret_cast<float*>(k_s), acc, m_s, l_s, group);
    dec_cluster_merge<D, GMAX>(reinterpret_cast<const float*>(k_s), group, n_act, (i64)seq * n_heads + head0, out,
                               part_acc, part_m, part_l, counters + (i64)seq * n_kv + g, &sc[0][0][0], l_s,
                               &last_block, lse_out, group_sinks);
#else
    if (writer) {
#pragma unroll
        for (int h = 0; h < GMAX; ++h) {
            if (h >= group) continue;
            const i64 row = (i64)seq * n_heads + head0 + h;
#pragma unroll
            for (int j = 0; j < S::DPT; ++j) part_acc[(row * n_blocks + b) * D + tid % D + j * DEC_THREADS] = acc[j][h];
            if (tid == 0) {
                part_m[row * n_blocks + b] = m_s[h];
                part_l[row * n_blocks + b] = l_s[h];
            }
        }
    }

    // Publish, count; the last of the n_act blocks merges (and resets the count).
    if (!attn_last_to_finish(counters + (i64)seq * n_kv + g, n_act, &last_block)) return;
    // One weight per active block and head: n_act <= MAX_BLOCKS = 128 = P * KB, so sc's rows hold them.
    attn_merge_splits<D>(part_acc, part_m, part_l, (i64)seq * n_heads + head0, group, n_blocks, 0, n_act,
                         &sc[0][0][0], n_act, l_s, out, lse_out, group_sinks);
#endif
}

// Cluster builds: compile-time cluster dims, which CuPy's launch and cuLaunchKernelEx both honour
// (pdl.py), and a minimum of DEC_MIN_BLOCKS resident blocks per SM: 3 is a budget of 168 registers (left
// to itself, ptxas gave some sm_90 variants 64 or 96 registers and spilled, with or without clusters).
// 4 (128 registers, 4 blocks an SM, which shared memory also allows at head dim 128) builds every head-dim-128
// variant without spills (nvcc 2026-12, sm_90): group 8 goes from 166 registers (3 blocks) to 128, and
// DEC_PVEC=1's group 4 from 138 to 128. Measured on the H100 (2026-12-07, with DEC_PVEC): within 1 % of 3 at every
// point of the dattn stage (128 x 256: 64.7 -> 64.2 us), so it stays 3 (PADDOCK_KERNEL_DEFINES=DEC_MIN_BLOCKS=4).
#ifndef DEC_MIN_BLOCKS
#define DEC_MIN_BLOCKS 3
#endif
#if DEC_CLUSTER > 1
#define DEC_KERNEL_ATTRS __launch_bounds__(DEC_THREADS, DEC_MIN_BLOCKS) __cluster_dims__(1, 1, DEC_CLUSTER)
#else
#define DEC_KERNEL_ATTRS __launch_bounds__(DEC_THREADS)
#endif

// KV_FP8: the caches' block scales [num_blocks, n_kv] follow the float16 build's arguments.
#if DEC_FP8
#define DEC_SCALE_PARAMS , const float *__restrict__ k_scale, const float *__restrict__ v_scale
#define DEC_SCALE_ARGS k_scale, v_scale
#else
#define DEC_SCALE_PARAMS
#define DEC_SCALE_ARGS nullptr, nullptr
#endif

#define ATTN_DEC_KERNEL(D, GMAX)                                                                                 \
    extern "C" __global__ void DEC_KERNEL_ATTRS attn_dec_d##D##_g##GMAX(                                         \
        const float* __restrict__ q, const dec_kv_t* __restrict__ k_cache, const dec_kv_t* __restrict__ v_cache,\
        const int* __restrict__ seq_lens, const int* __restrict__ block_tables, int table_stride, int n_heads,  \
        int n_kv, int block_size, float scale, float softcap, int window, dec_out_t* __restrict__ out,         \
        float* __restrict__ part_acc, float* __restrict__ part_m, float* __restrict__ part_l,                  \
        int* __restrict__ counters, const int* __restrict__ key_floor, float* __restrict__ lse_out,            \
        const float* __restrict__ sinks DEC_SCALE_PARAMS) {                                                    \
        attn_decode_body<D, GMAX, false>(q, k_cache, v_cache, seq_lens, block_tables, table_stride, n_heads,    \
                                         n_kv, block_size, scale, softcap, window, out, part_acc, part_m,       \
                                         part_l, counters, key_floor, lse_out, sinks, DecRope{}, DEC_SCALE_ARGS);\
    }

// rope_cache then attn_dec_d*: the same arguments with qkv for q, then rope_cache's.
#define ATTN_DEC_ROPE_KERNEL(D, GMAX)                                                                            \
    extern "C" __global__ void DEC_KERNEL_ATTRS attn_dec_rope_d##D##_g##GMAX(                                    \
        const float* __restrict__ qkv, u16* __restrict__ k_cache, u16* __restrict__ v_cache,                    \
        const int* __restrict__ seq_lens, const int* __restrict__ block_tables, int table_stride, int n_heads,  \
        int n_kv, int block_size, float scale, float softcap, int window, dec_out_t* __restrict__ out,         \
        float* __restrict__ part_acc, float* __restrict__ part_m, float* __restrict__ part_l,                  \
        int* __restrict__ counters, const int* __restrict__ key_floor, float* __restrict__ lse_out,            \
        const float* __restrict__ sinks, const float* __restrict__ q_norm, const float* __restrict__ k_norm,   \
        float eps, const int* __restrict__ positions, const float* __restrict__ cos_t,                         \
        const float* __restrict__ sin_t, int max_pos, int rot_half, int interleaved,                           \
        const int* __restrict__ slots) {                                                                        \
        const DecRope rope = {q_norm, k_norm,   eps,         positions, cos_t,  sin_t,                          \
                              max_pos, rot_half, interleaved, slots,     k_cache, v_cache};                     \
        attn_decode_body<D, GMAX, true>(qkv, k_cache, v_cache, seq_lens, block_tables, table_stride, n_heads,   \
                                        n_kv, block_size, scale, softcap, window, out, part_acc, part_m,        \
                                        part_l, counters, key_floor, lse_out, sinks, rope, nullptr, nullptr);   \
    }

#define ATTN_DEC_BOTH(D, GMAX) ATTN_DEC_KERNEL(D, GMAX) ATTN_DEC_ROPE_KERNEL(D, GMAX)

// The variants whose shared memory fits the 48 KB a block gets without an opt-in (attention_decode.py
// sends the others to attention.cu). A wrapper's build (ATTN_D, ATTN_G) holds one entry: the
// rope_cache-fused one when ATTN_ROPE is 1.
#if DEC_FP8 && defined(ATTN_ROPE) && ATTN_ROPE
#error "no ATTN_ROPE build reads FP8 caches: rope_cache.cu and write_kv_fp8 write the new token"
#elif DEC_FP8 && defined(PADDOCK_ALL_VARIANTS)
ATTN_DEC_KERNEL(64, 1) ATTN_DEC_KERNEL(64, 2) ATTN_DEC_KERNEL(64, 4) ATTN_DEC_KERNEL(64, 8) ATTN_DEC_KERNEL(64, 16)
ATTN_DEC_KERNEL(128, 1) ATTN_DEC_KERNEL(128, 2) ATTN_DEC_KERNEL(128, 4) ATTN_DEC_KERNEL(128, 8)
ATTN_DEC_KERNEL(256, 1) ATTN_DEC_KERNEL(256, 2) ATTN_DEC_KERNEL(256, 4) ATTN_DEC_KERNEL(256, 8)
#elif defined(PADDOCK_ALL_VARIANTS)
ATTN_DEC_BOTH(64, 1) ATTN_DEC_BOTH(64, 2) ATTN_DEC_BOTH(64, 4) ATTN_DEC_BOTH(64, 8) ATTN_DEC_BOTH(64, 16)
ATTN_DEC_BOTH(128, 1) ATTN_DEC_BOTH(128, 2) ATTN_DEC_BOTH(128, 4) ATTN_DEC_BOTH(128, 8)
ATTN_DEC_BOTH(256, 1) ATTN_DEC_BOTH(256, 2) ATTN_DEC_BOTH(256, 4) ATTN_DEC_BOTH(256, 8)
#elif defined(ATTN_ROPE) && ATTN_ROPE
#define ATTN_DEC_SELECTED(D, GMAX) ATTN_DEC_ROPE_KERNEL(D, GMAX)  // one more expansion, so ATTN_D becomes its value
ATTN_DEC_SELECTED(ATTN_D, ATTN_G)
#else
#define ATTN_DEC_SELECTED(D, GMAX) ATTN_DEC_KERNEL(D, GMAX)
ATTN_DEC_SELECTED(ATTN_D, ATTN_G)
#endif
