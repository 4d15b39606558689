"""Launch plans of the CUDA wrappers (pure Python: runs in CI, no GPU, no CuPy)."""

from __future__ import annotations

import pytest

from app.engine.backend.cuda.linear import one_token_runs
from app.engine.kernels.attention import MAX_SPLITS, MIN_SPLIT, NO_SPLIT, group_bucket, plan_splits
from app.engine.kernels.attention_decode import MAX_BLOCKS, MAX_CLUSTER, block_layout, plan_blocks
from app.engine.kernels.gemv import MAX_WARPS, VARIANTS, default_rows, default_warps, few_rows_shape

SMS = 132


@pytest.mark.parametrize(
    ("n_tok", "n_kv", "ctx"), [(1, 8, 512), (1, 8, 32768), (1, 1, 32768), (16, 8, 4096), (3, 2, 100)]
)
def test_split_plan_covers_the_context(n_tok: int, n_kv: int, ctx: int) -> None:
    plan = plan_splits(n_tok, n_kv, ctx, SMS, 4 * n_kv, 128)
    if plan.num_splits == 1:
        assert plan.split_len == NO_SPLIT
    else:
        assert plan.num_splits <= MAX_SPLITS
        assert plan.split_len >= MIN_SPLIT and plan.split_len % 32 == 0
        assert (plan.num_splits - 1) * plan.split_len < ctx <= plan.num_splits * plan.split_len


def test_no_split_when_tokens_fill_the_gpu() -> None:
    assert plan_splits(2048, 8, 2048, SMS, 32, 128).num_splits == 1
    assert plan_splits(1, 8, MIN_SPLIT, SMS, 32, 128).num_splits == 1


def test_register_capped_build_only_for_small_grids_and_groups() -> None:
    assert plan_splits(1, 8, 32768, SMS, 32, 128).min_blocks == 4  # one decode: few blocks
    assert plan_splits(16, 8, 32768, SMS, 32, 128).min_blocks == 1  # a batch of long decodes
    assert plan_splits(1, 2, 32768, SMS, 32, 128).min_blocks == 1  # 16 heads per KV head: would spill
    assert plan_splits(1, 8, 32768, SMS, 32, 512).min_blocks == 1  # 512-wide heads (Gemma 4's): would spill


def test_group_buckets() -> None:
    assert [group_bucket(h, 1) for h in (1, 2, 3, 4, 5, 16)] == [1, 2, 4, 4, 8, 16]
    assert group_bucket(64, 2) is None


def test_gemv_defaults_are_compiled_variants() -> None:
    for bucket, rows in VARIANTS.items():
        for qtype in ("Q4_K", "Q5_K", "Q6_K", "Q8_0", "F16"):
            assert default_rows(bucket, qtype) in rows
    assert default_rows(1, "Q4_K") == 4 and default_rows(1, "Q8_0") == 8
    assert [default_warps(c) for c in (640, 4096, 12288)] == [1, 4, 4]


def test_few_rows_take_a_block_each() -> None:
    """A one-token product of fewer rows than twice the multiprocessors gets a block per row (a compiled
    variant) and a lane per 32-weight unit; anything larger, or more tokens, keeps the tuned shape."""
    rows, warps = few_rows_shape(1, 96, 5120, SMS)  # Qwen3.5-27B's beta|alpha
    assert rows in VARIANTS[1] and rows == 1 and warps == 5
    assert few_rows_shape(1, 64, 2048, SMS) == (1, 2)
    assert few_rows_shape(1, 256, 2048, SMS) == (1, 2)  # a 256-expert router
    assert few_rows_shape(1, 200, 65536, SMS) == (1, MAX_WARPS)
    assert few_rows_shape(1, 2 * SMS, 5120, SMS) is None
    assert few_rows_shape(2, 96, 5120, SMS) is None


@pytest.mark.parametrize(("kinds", "runs"), [
    ([True, True, False], [range(0, 2), range(2, 3)]),  # Gated DeltaNet: qkv + z in one launch, beta|alpha
    ([True] * 4, [range(0, 3), range(3, 4)]),  # q/k/v, then the output gate
    ([False, True, True, True, True, False], [range(0, 1), range(1, 4), range(4, 5), range(5, 6)]),
    ([False, False], [range(0, 1), range(1, 2)]),
    ([True, False, True], [range(0, 1), range(1, 2), range(2, 3)]),
])  # fmt: skip
def test_one_token_runs(kinds: list[bool], runs: list[range]) -> None:
    assert one_token_runs(kinds) == runs


def test_decode_blocks_without_clusters_are_the_request() -> None:
    assert [block_layout(n, clusters=False) for n in (0, 1, 3, 66, 500)] == [
        (1, 1), (1, 1), (3, 1), (66, 1), (MAX_BLOCKS, 1)
    ]  # fmt: skip


def test_decode_blocks_fill_whole_clusters() -> None:
    """sm_90+: whole clusters of a power of two (at most MAX_CLUSTER) blocks that hold the request,
    no cluster for one block, never past MAX_BLOCKS."""
    for n in range(1, MAX_BLOCKS + 2):
        blocks, cluster = block_layout(n, clusters=True)
        assert blocks % cluster == 0 and blocks <= MAX_BLOCKS, n
        assert cluster in (1, 2, 4, MAX_CLUSTER) and (cluster == 1) == (n == 1), n
        assert min(n, MAX_BLOCKS) <= blocks < min(n, MAX_BLOCKS) + cluster, n
        if n <= MAX_CLUSTER:
            assert blocks == cluster, n  # up to one cluster's worth: one cluster, as small as holds it
    assert block_layout(66, clusters=True) == (72, MAX_CLUSTER)  # one sequence of Qwen3-8B on an H200


def test_decode_plan_keeps_a_wide_batch_to_one_wave_of_blocks() -> None:
    """At least one (sequence, KV head) pair per multiprocessor: blocks a pair rounded down to a power of two,
    so that with block_layout's clusters the batch takes at most blocks_per_sm x SMs blocks (or one a pair); fewer pairs
    keep the rounded-up plan (long contexts); never more blocks than the context's chunks."""
    sms, bps, ctx = 132, 4, 4096  # H100, the default tuning, a serve run's graph context
    for n_seqs in range(1, 257):
        pairs = n_seqs * 8
        n = plan_blocks(n_seqs, 8, ctx, sms, 128, bps)
        total = block_layout(n, clusters=True)[0] * pairs
        if pairs >= sms:
            assert total <= max(pairs, bps * sms), n_seqs  # one wave, or one block a pair
            assert n == 1 or 2 * n * pairs > bps * sms, n_seqs  # and no fewer than that takes
        else:
            assert n == min(64, -(-bps * sms // pairs)), n_seqs
    assert [plan_blocks(s, 8, ctx, sms, 128, bps) for s in (1, 8, 16, 32, 64, 128)] == [64, 9, 5, 2, 1, 1]
    assert plan_blocks(32, 8, 100, sms, 128, bps) == 2 and plan_blocks(32, 8, 64, sms, 128, bps) == 1  # chunks


def test_gemv_int_launch_shape_caps_and_overrides() -> None:
    """Wide Q4_K gate/up and q/k/v builds take their tighter register caps and the wide k-quant
    single products 16-warp blocks; other formats and narrow builds keep the kernel's shapes; A/B
    overrides win, the format-specific key over the kernel's."""
    from app.engine.kernels import gemv_int
    from app.engine.kernels.gemv_plan import GemvPlan
    from app.engine.kernels.options import ShapeOverrides
    from app.engine.kernels.tuning import LaunchShape, for_arch

    plan = GemvPlan(tuning=for_arch("90"))
    wide = plan.tuning.gemv_int_wide_cols
    narrow = wide // 4
    assert gemv_int.launch_shape("GATED", wide, "Q4_K", plan) == LaunchShape(2, 8, 1, 3)
    assert gemv_int.launch_shape("MULTI", wide, "Q4_K", plan) == LaunchShape(1, 8, 2, 3)
    assert gemv_int.launch_shape("GATED", wide, "Q8_0", plan).min_blocks == 2
    assert gemv_int.launch_shape("GATED", narrow, "Q4_K", plan) == LaunchShape(1, 8, 1, 2)
    assert gemv_int.launch_shape("SINGLE", wide, "Q4_K", plan) == LaunchShape(2, 16, 2, 1)
    assert gemv_int.launch_shape("SINGLE", narrow, "Q6_K", plan) == LaunchShape(2, 8, 2, 2)
    assert gemv_int.launch_shape("SINGLE", wide, "Q8_0", plan) == LaunchShape(2, 8, 2, 2)

    overrides = ShapeOverrides(
        min_blocks=1,
        min_blocks_by_key={"GATED": 2, "GATED_Q6_K": 4},
        shapes_by_key={"MULTI": (2, 4, 1), "MULTI_Q8_0": (1, 8, 1)},
    )
    plan = GemvPlan(tuning=for_arch("90"), overrides=overrides)
    assert gemv_int.launch_shape("MULTI", wide, "Q4_K", plan) == LaunchShape(2, 4, 1, 1)
    assert gemv_int.launch_shape("MULTI", narrow, "Q8_0", plan) == LaunchShape(1, 8, 1, 1)
    assert gemv_int.launch_shape("GATED", wide, "Q4_K", plan).min_blocks == 2
    assert gemv_int.launch_shape("GATED", wide, "Q6_K", plan).min_blocks == 4
