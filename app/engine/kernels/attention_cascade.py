"""Cascade attention for a decode batch whose sequences share the blocks that lead their block
tables: several agent sessions over one long system prompt, or one conversation's branches.

Plain decode attention reads each sequence's whole context, so eight sessions over one 8,000-token
prefix read that prefix's keys eight times a step. Here the shared keys [0, length) are read once
for the whole batch: every (token, query head) row of the batch is a query row of one pseudo
sequence that attention_prefill.cu (tensor cores) runs over the shared blocks, in KV splits; each
sequence's own keys [length, position] go through attention_decode.cu with its key floor, which also
gives each row's log-sum-exp; one merge weighs the two parts (attn_prefill_merge).

Every count the kernels need is read from the device (SharedPrefix), so a CUDA graph captured once
serves any shared length its replays bring. Only for layers without a sliding window: a window
would cut into the shared keys differently per sequence.
"""

from __future__ import annotations

from typing import Any

from app.engine.kernels import attention_prefill
from app.engine.kernels.attention_decode import attention_decode
from app.engine.kernels.runtime.launch import cdiv

MIN_SHARED_TOKENS = 512  # below this the shared keys are too few for a second launch to pay
MAX_SPLITS = 32  # of the shared keys: about one wave of the prefill kernel's resident blocks
# Blocks a (sequence, KV head) of the own keys, at most (fewer where the plain decode plan has fewer). A CUDA graph's plan
# sees only the model's whole context, not the own keys past the shared prefix (a few hundred in an agent session):
# at 8 sessions of Qwen3-8B over 8,000 shared keys it took 9 blocks a pair, 14.9 us, against 9.6 with 4 and 11.2
# with 2; the step's ITL 5.86 -> 5.64 ms with 4 (H100, bench/results/gpu-s30-2026-12-07.md).
OWN_BLOCKS = 4


def key_warps(n_seqs: int, n_heads: int, n_kv: int, head_dim: int, max_rows: int) -> bool:
    """Whether the shared part runs on attention_prefill's key-split build (KEY_WARPS): the batch's rows a KV head
    (sequences x query heads of its group) at most `max_rows` (KernelOptions.cascade_key_warps) and within one of
    the build's row tiles (32 rows, 16 from head dim 256), where it fits. With 32 rows the other build keeps one
    warp of four busy: 8 sessions' shared part on the H100 in 29.2 us against 34.8; with 64, the key-split build's
    two row tiles each read the keys, 54.3 against 37.7."""
    rows = n_seqs * (n_heads // n_kv)
    one_tile = attention_prefill.rows_per_block(head_dim, key_warps=True)
    return rows <= min(max_rows, one_tile) and attention_prefill.key_warps_fit(head_dim)


def plan_splits(n_kv: int, sm_count: int) -> int:
    """KV splits of the shared part: the prefill kernel's resident blocks over the KV heads (the
    batch's rows fill one tile per head up to 128 rows, i.e. 32 sequences at four heads per KV head),
    at least 2 (split partials are what the merge takes)."""
    return max(2, min(MAX_SPLITS, cdiv(attention_prefill.RESIDENT * sm_count, n_kv)))


def shared_length(seq_lens: Any, tables: Any, block_size: int) -> int:
    """Keys [0, L) every row of a decode batch shares: the longest run of identical leading block
    ids, over whole blocks before each row's newest key (its own part keeps at least that key)."""
    import numpy as np

    if len(seq_lens) < 2:
        return 0
    limit = int((np.asarray(seq_lens) - 1).min()) // block_size
    if limit <= 0:
        return 0
    lead = tables[:, :limit]
    same = (lead == lead[0]).all(axis=0)
    blocks = limit if same.all() else int(np.argmin(same))
    return blocks * block_size


def cascade_decode(
    q: Any, k_cache: Any, v_cache: Any, seq_lens: Any, block_tables: Any, shared: Any, scale: float,
    softcap: float | None, n_blocks: int, num_splits: int, out: Any, clusters: bool = True, key_warp_rows: int = 0,
) -> Any:  # fmt: skip
    """`out [S, n_heads, D]` (float32, or float16 for a product that reads it) for a decode batch (as
    attention_decode) whose sequences share the keys [0, shared.length) through the same blocks at the head of
    every block table. `shared`: a backend.base.SharedPrefix (device arrays of the step). `n_blocks`: the own keys'
    blocks a (sequence, KV head), as attention_decode takes them. `key_warp_rows`: the most rows a KV head whose
    shared part takes the key-split build (key_warps); 0: never."""
    import cupy

    n_seqs, n_heads, head_dim = q.shape
    own = cupy.empty_like(q)  # float32: the merge reads it
    lse = cupy.empty((n_seqs, n_heads), cupy.float32)
    attention_decode(q, k_cache, v_cache, seq_lens, block_tables, scale, None, softcap, n_blocks, own, clusters,
                     key_floor=shared.length, lse_out=lse)  # fmt: skip
    # The batch's rows as one sequence of n_seqs tokens at positions length - 1 ...: each sees every
    # shared key (the causal edge is past them) and no other (the key limit).
    part_o, part_ml = attention_prefill.split_partials(
        q, k_cache, v_cache, shared.query_start_loc, shared.seq_len, block_tables[:1], scale, None, softcap,
        num_splits, key_limit=shared.length,
        key_warps=key_warps(n_seqs, n_heads, k_cache.shape[2], head_dim, key_warp_rows),
    )  # fmt: skip
    return attention_prefill.merge_splits(part_o, part_ml, out, own, lse)
