"""Wrapper of attention_decode.cu: paged attention for decode batches (one token per sequence).

CudaBackend.attention sends a decode batch here when the (head_dim, group) variant exists
(the ones whose shared memory fits 48 KB) and its KernelOptions have the path on; prefill and
mixed batches, and the rest, go to attention.cu.

On sm_90+ the blocks of one (sequence, KV head) run in thread-block clusters that merge their
partial sums through each other's shared memory (block_layout); `clusters=False` keeps the
global-memory merge there too.

attention_decode_qkv is the same attention with rope_cache.cu's work done inside it (one launch
less per layer at decode), where rope_supported says it applies and the backend's tuning says it
pays (otherwise the caller runs rope_cache and attention_decode).
"""

from __future__ import annotations

from typing import Any

from app.engine.kernels.attention import group_bucket, split_counters
from app.engine.kernels.kv_format import is_fp8, kv_operands
from app.engine.kernels.runtime.compile import MAX_CLUSTER, clusters_supported, get_kernel
from app.engine.kernels.runtime.launch import NULL, cdiv, f32, i32, launch, ptr

# (256, 8): Qwen3.5's 24 query heads over 4 KV heads and Qwen3.5-MoE's 16 over 2 (~46 KB of shared memory)
VARIANTS = frozenset({(64, 1), (64, 2), (64, 4), (64, 8), (64, 16), (128, 1), (128, 2), (128, 4), (128, 8),
                      (256, 1), (256, 2), (256, 4), (256, 8)})  # fmt: skip
MAX_BLOCKS = 128  # blocks per (sequence, KV head): the merge keeps one weight per block in shared memory


def chunk_keys(head_dim: int) -> int:
    """Keys a block takes per step (DecShape::KB)."""
    return 64 if head_dim <= 128 else 32


def supports(head_dim: int, n_heads: int, n_kv: int) -> bool:
    """Whether a decode variant exists for these heads."""
    if n_heads % n_kv:
        return False
    return (head_dim, group_bucket(n_heads, n_kv)) in VARIANTS


def plan_blocks(
    n_seqs: int, n_kv: int, max_seq_len: int, sm_count: int, head_dim: int, blocks_per_sm: int
) -> int:
    """Blocks per (sequence, KV head): one per chunk of the longest context, capped at about
    `blocks_per_sm` blocks per multiprocessor over the batch (enough in flight to stream a long
    context at full bandwidth: the tuning's decode_blocks_per_sm, the blocks a multiprocessor holds
    at once, 4 for sm_90's cluster builds of 128 registers); a block loops over the chunks beyond
    that. Contexts shorter than the plan leave the extra blocks idle (they return at once, but for
    those in a cluster with active blocks), so one plan serves every step a CUDA graph replays.

    A batch of at least one (sequence, KV head) pair per multiprocessor gets at most one wave of
    blocks: rounded down, to a power of two that block_layout's clusters keep. Rounded up, 32
    sequences of Qwen3-8B took 4 blocks a pair, two waves, and at serving's short contexts the
    second wave's blocks mostly idle: 32.9 us against 25.0 us with 2 blocks at 256 keys, 42.1
    against 38.2 us with 1 at 64 sequences (H100, 2026-12-07, bench/micro/attention_decode_times.py
    --batch). Fewer pairs keep the rounded-up plan, which long contexts want (8 sequences at 8,000
    keys: 16 blocks a pair in 137-142 us against 8 in 153-161 us)."""
    chunks = cdiv(max(1, max_seq_len), chunk_keys(head_dim))
    pairs, slots = n_seqs * n_kv, blocks_per_sm * sm_count
    if pairs >= sm_count:
        per_pair = 1 << (max(1, slots // pairs).bit_length() - 1)
        return max(1, min(chunks, per_pair, MAX_BLOCKS))
    return max(1, min(chunks, cdiv(slots, pairs), MAX_BLOCKS))


def block_layout(n_blocks: int, clusters: bool) -> tuple[int, int]:
    """(blocks per (sequence, KV head), blocks per cluster) for a request of `n_blocks`: the one
    place that decides both, as the launch's grid and the kernel's ATTN_CL.

    With clusters, the smallest power of two that holds the request, at most MAX_CLUSTER, and the
    blocks rounded up to a multiple of it: a context of up to that many chunks merges in one
    cluster's shared memory. A cluster keeps its idle blocks resident until its active ones are
    done, so a small request (a large batch, a few blocks each) gets a small cluster rather than
    eight blocks of which most wait. One block needs no merge: no cluster."""
    n = max(1, min(n_blocks, MAX_BLOCKS))
    if not clusters or n == 1:
        return n, 1
    cluster = min(MAX_CLUSTER, 1 << (n - 1).bit_length())
    return cdiv(n, cluster) * cluster, cluster


def rope_supported(head_dim: int, n_heads: int, n_kv: int, rotary_dim: int) -> bool:
    """Whether attention_decode_qkv applies: a decode variant exists (supports), the rotation fits the
    head (`rotary_dim`, twice the cos/sin tables' width, at most head_dim: below it, partial RoPE as in
    rope_cache), and head_dim is 64, 128 or 256: a head's D/2 pairs are whole warps of the 128-thread
    block, so its norm is a sum over whole warps."""
    if not 0 < rotary_dim <= head_dim:
        return False
    return head_dim in (64, 128, 256) and supports(head_dim, n_heads, n_kv)


def attention_decode(
    q: Any, k_cache: Any, v_cache: Any, seq_lens: Any, block_tables: Any, scale: float,
    sliding_window: int | None, softcap: float | None, n_blocks: int, out: Any, clusters: bool = True,
    key_floor: Any = None, lse_out: Any = None, sinks: Any = None,
) -> Any:  # fmt: skip
    """`out [S, n_heads, D]` (float32, or float16: each element rounded once) for float32
    `q [S, n_heads, D]`, one token per sequence, whose position is its `seq_lens` entry minus one
    (its own key already written to the cache).
    `clusters`: merge through thread-block clusters where the device has them.

    For a cascade decode (attention_cascade.py): `key_floor` (int32 [1] on the device, read at run
    time so a graph's replays may change it) leaves out the keys below it, and `lse_out`
    (float32 [S, n_heads]) receives each row's natural-log sum of exponentials, what the merge with
    the left-out keys' attention weighs this part by. `sinks` (float32 [n_heads], GPT-OSS): one more
    logit per head in its softmax's denominator, weighing no value."""
    n_seqs, n_heads, head_dim = q.shape
    extras = (ptr(key_floor), ptr(lse_out), ptr(sinks))
    return _launch("attn_dec", {}, n_seqs, n_heads, head_dim, q, k_cache, v_cache, seq_lens, block_tables, scale,
                   sliding_window, softcap, n_blocks, out, (), clusters, extras)  # fmt: skip


def attention_decode_qkv(
    qkv: Any, n_heads: int, n_kv: int, head_dim: int, q_norm: Any | None, k_norm: Any | None, eps: float,
    positions: Any, cos: Any, sin: Any, interleaved: bool, k_cache: Any, v_cache: Any, slots: Any,
    seq_lens: Any, block_tables: Any, scale: float, sliding_window: int | None, softcap: float | None,
    n_blocks: int, out: Any, clusters: bool = True,
) -> Any:  # fmt: skip
    """Exactly `rope_cache(qkv, n_heads, n_kv, head_dim, q_norm, k_norm, eps, positions, cos, sin,
    interleaved, k_cache, v_cache, slots, q)` then `attention_decode(q, k_cache, v_cache, seq_lens,
    block_tables, scale, sliding_window, softcap, n_blocks, out)`, in one launch and without q: fills
    `out [S, n_heads, D]` from the float32 projection output `qkv [S, (n_heads + 2 n_kv) * D]` of one
    new token per sequence, and stores its normalized, rotated k and its v (float16) in the caches
    at `slots[s]` (nothing for a slot < 0: a padding token, whose output is finite but meaningless).

    As with attention_decode, token s sits at position `seq_lens[s] - 1`, and `slots[s]` must be that
    position's slot in its block table (the new key is used from registers, never read back).
    `positions[s]` chooses the rotation, as in rope_cache. Needs rope_supported(...)."""
    if qkv.shape[1] != (n_heads + 2 * n_kv) * head_dim:
        raise ValueError(f"qkv of shape {qkv.shape} is not {n_heads} + 2 x {n_kv} heads of {head_dim}")
    if k_cache.shape[2] != n_kv or k_cache.shape[3] != head_dim:
        raise ValueError(f"cache rows of {k_cache.shape[2:]} do not hold {n_kv} heads of {head_dim}")
    if (q_norm is None) != (k_norm is None):
        raise ValueError("q_norm and k_norm come together")
    if is_fp8(k_cache):
        raise ValueError("no fused rope decode attention over FP8 caches: run rope_cache, then attention_decode")
    if not rope_supported(head_dim, n_heads, n_kv, cos.shape[1] * 2):
        raise ValueError(f"no fused rope decode attention for head_dim {head_dim}, rotary {cos.shape[1] * 2}, "
                         f"{n_heads // n_kv} heads per KV head")  # fmt: skip
    table = (cos, sin, i32(cos.shape[0]), i32(cos.shape[1]), i32(interleaved))
    rope_args = (ptr(q_norm), ptr(k_norm), f32(eps), positions, *table, slots)
    return _launch("attn_dec_rope", {"ATTN_ROPE": 1}, qkv.shape[0], n_heads, head_dim, qkv, k_cache, v_cache,
                   seq_lens, block_tables, scale, sliding_window, softcap, n_blocks, out, rope_args,
                   clusters)  # fmt: skip


def _launch(
    entry: str, defines: dict[str, int], n_seqs: int, n_heads: int, head_dim: int, q: Any, k_cache: Any,
    v_cache: Any, seq_lens: Any, block_tables: Any, scale: float, sliding_window: int | None,
    softcap: float | None, n_blocks: int, out: Any, extra_args: tuple[Any, ...], clusters: bool,
    extras: tuple[Any, Any, Any] = (NULL, NULL, NULL),
) -> Any:  # fmt: skip
    """One launch of kernel `entry`_d{D}_g{G} of attention_decode.cu: grid (sequence, KV head, block),
    partial buffers for the splits, the `extras` pointers (key floor, lse out, sinks; NULL: none), then
    the kernel's own `extra_args`."""
    import cupy

    n_kv, block_size = k_cache.shape[2], k_cache.shape[1]
    if not supports(head_dim, n_heads, n_kv):
        raise ValueError(
            f"no decode attention variant for head_dim {head_dim}, {n_heads // n_kv} heads per KV head"
        )
    if n_seqs == 0:
        return out
    gmax = group_bucket(n_heads, n_kv)
    n_blocks, cluster = block_layout(n_blocks, clusters and clusters_supported())
    kv = kv_operands(k_cache, v_cache)
    if out.dtype.name not in ("float32", "float16"):
        raise ValueError(f"decode attention writes float32 or float16, not {out.dtype}")
    half = int(out.dtype.name == "float16")  # DEC_OUT_HALF: for an output projection that reads float16
    defines = {"ATTN_D": head_dim, "ATTN_G": gmax, "ATTN_CL": cluster, "DEC_OUT_HALF": half, **defines, **kv.defines}
    kernel = get_kernel("attention_decode.cu", f"{entry}_d{head_dim}_g{gmax}", defines)
    part_acc = cupy.empty((n_seqs, n_heads, n_blocks, head_dim), cupy.float32)
    part_m = cupy.empty((n_seqs, n_heads, n_blocks), cupy.float32)
    part_l = cupy.empty((n_seqs, n_heads, n_blocks), cupy.float32)
    args = (
        q, kv.k, kv.v, seq_lens, block_tables, i32(block_tables.shape[1]), i32(n_heads), i32(n_kv),
        i32(block_size), f32(scale), f32(softcap or 0.0), i32(sliding_window or 0), out, part_acc, part_m, part_l,
        split_counters(n_seqs * n_kv), *extras, *extra_args, *kv.scales,
    )  # fmt: skip
    launch(kernel, (n_seqs, n_kv, n_blocks), (128,), args)
    return out
