"""The tuning tables (app/engine/kernels/tuning/*.json) drive the launch shapes the code's tables
drove before they became data: every shipped GPU, kernel, format and width, against those tables
copied here as literals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.engine.kernels import gemv_int
from app.engine.kernels.gemv import TOKEN_BUCKETS, VARIANTS, default_rows, fused_rows
from app.engine.kernels.gemv_plan import GemvPlan
from app.engine.kernels.tuning import GEMV_INT_KERNELS, LaunchShape, Tuning, for_arch, merge, write_overlay

SHIPPED_ARCHS = ("86", "89", "90", "120")
FORMATS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "F16", "BF16", "F32")
WIDTHS = (256, 1024, 2048, 4064, 4096, 5120, 12288, 25600)

# The tables as gemv_int.py and gemv.py held them before this move (commit 793051e).
OLD_WIDE_COLS = 4096
OLD_SHAPES = {  # kernel -> (below WIDE_COLS, from there on): (rows, warps, units), min_blocks 2
    "SINGLE": ((2, 8, 2), (2, 8, 2)),
    "GATED": ((1, 8, 1), (2, 8, 1)),
    "MULTI": ((2, 4, 2), (1, 8, 2)),
}
OLD_WIDE_BY_FORMAT = {  # (rows, warps, units, min_blocks)
    "GATED_Q4_K": (2, 8, 1, 3),
    "MULTI_Q4_K": (1, 8, 2, 3),
    "SINGLE_Q4_K": (2, 16, 2, 1),
    "SINGLE_Q6_K": (1, 8, 2, 1),  # (2, 16, 2, 1) until 2026-12-06's H100 sweep (docs/tuning-log.md)
}
OLD_DEFAULT_MIN_BLOCKS = 2
OLD_MAX_QB = 2
OLD_FUSED_NORM_MAX_COLS = 2048
OLD_ROWS_PER_BLOCK = {1: 8, 2: 4, 4: 2, 8: 2}
OLD_SINGLE_TOKEN_ROWS = {"Q4_K": 4, "Q5_K": 4}
OLD_FUSED_ROWS_T1 = 4
OLD_DECODE_BLOCKS_PER_SM = 4
OLD_ROPE_MAX_SEQS, OLD_ROPE_MIN_Q_WIDTH = 1, 4096


def old_int_shape(kernel: str, n_cols: int, first_format: str) -> LaunchShape:
    wide = n_cols >= OLD_WIDE_COLS
    key = f"{kernel}_{first_format}"
    if wide and key in OLD_WIDE_BY_FORMAT:
        return LaunchShape(*OLD_WIDE_BY_FORMAT[key])
    return LaunchShape(*OLD_SHAPES[kernel][wide], OLD_DEFAULT_MIN_BLOCKS)


def old_rows(bucket: int, qtype_name: str) -> int:
    if bucket == 1:
        return OLD_SINGLE_TOKEN_ROWS.get(qtype_name, OLD_ROWS_PER_BLOCK[1])
    return OLD_ROWS_PER_BLOCK[bucket]


@pytest.mark.parametrize("arch", SHIPPED_ARCHS)
def test_int_x_shapes_and_defines_match_the_old_tables(arch: str) -> None:
    plan = GemvPlan(tuning=for_arch(arch))
    for kernel in GEMV_INT_KERNELS:
        for fmt in FORMATS:
            for n_cols in WIDTHS:
                want = old_int_shape(kernel, n_cols, fmt)
                assert gemv_int.launch_shape(kernel, n_cols, fmt, plan) == want, (arch, kernel, fmt, n_cols)
                threads = 32 * want.warps
                old_qb = (
                    1
                    if want.min_blocks > OLD_DEFAULT_MIN_BLOCKS
                    else max(1, min(OLD_MAX_QB, -(-(n_cols // 16) // threads)))
                )
                defines = gemv_int._defines([fmt], gemv_int._build_shape(kernel, n_cols, fmt, None, None, None, plan),
                                            n_cols, plan=plan)  # fmt: skip
                assert defines["XQ_QB"] == old_qb and defines["XQ_MIN_BLOCKS"] == want.min_blocks
    assert plan.norm_max_cols == OLD_FUSED_NORM_MAX_COLS


@pytest.mark.parametrize("arch", SHIPPED_ARCHS)
def test_float_x_rows_and_decode_attention_match_the_old_tables(arch: str) -> None:
    tuning = for_arch(arch)
    plan = GemvPlan(tuning=tuning)
    for bucket in TOKEN_BUCKETS:
        assert fused_rows(bucket, plan) == (OLD_FUSED_ROWS_T1 if bucket == 1 else OLD_ROWS_PER_BLOCK[bucket])
        for fmt in FORMATS:
            assert default_rows(bucket, fmt, plan) == old_rows(bucket, fmt)
            assert default_rows(bucket, fmt, plan) in VARIANTS[bucket]  # a compiled variant
    assert tuning.decode_blocks_per_sm == OLD_DECODE_BLOCKS_PER_SM
    for n_seqs in (1, 2, 32):
        for q_width in (1024, 2048, 4096, 8192):
            old = n_seqs <= OLD_ROPE_MAX_SEQS and q_width >= OLD_ROPE_MIN_Q_WIDTH
            assert tuning.decode_rope_pays(n_seqs, q_width) == old


def test_an_architecture_file_replaces_only_its_entries(tmp_path: Path) -> None:
    shipped = Path(gemv_int.__file__).parent / "tuning" / "default.json"
    (tmp_path / "default.json").write_text(shipped.read_text())
    wide_gated = {"rows": 4, "warps": 4, "units": 1, "min_blocks": 2}
    (tmp_path / "sm89.json").write_text(
        json.dumps({"gemv_int": {"wide_by_format": {"GATED_Q4_K": wide_gated}}})
    )
    tuned, default = for_arch("89", tmp_path), for_arch("90", tmp_path)
    assert tuned.gemv_int_shape("GATED", 4096, "Q4_K") == LaunchShape(4, 4, 1, 2)
    assert default.gemv_int_shape("GATED", 4096, "Q4_K") == LaunchShape(2, 8, 1, 3)
    assert tuned.gemv_int_shape("MULTI", 4096, "Q4_K") == default.gemv_int_shape("MULTI", 4096, "Q4_K")
    assert tuned.gemv_rows(1, "Q4_K") == 4


def test_merge_is_by_key_and_leaves_its_inputs() -> None:
    base = {"a": {"x": 1, "y": 2}, "b": 3}
    assert merge(base, {"a": {"y": 5}}) == {"a": {"x": 1, "y": 5}, "b": 3}
    assert base == {"a": {"x": 1, "y": 2}, "b": 3}


def test_every_shipped_file_is_complete() -> None:
    """Each shape entry names its four fields (a missing one would surface only at launch)."""
    folder = Path(gemv_int.__file__).parent / "tuning"
    for path in sorted(folder.glob("*.json")):
        tuning = Tuning(
            None, merge(json.loads((folder / "default.json").read_text()), json.loads(path.read_text()))
        )
        for kernel in GEMV_INT_KERNELS:
            for fmt in FORMATS:
                for n_cols in (1024, 4096):
                    assert isinstance(tuning.gemv_int_shape(kernel, n_cols, fmt), LaunchShape), path.name


def test_a_sweeps_overlay_holds_only_what_differs(tmp_path: Path) -> None:
    """tuning.write_overlay (bench/micro/gemv_sweep.py's write_tuning): measured shapes the tables already
    give are left out; the others come back from for_arch."""
    shipped = Path(gemv_int.__file__).parent / "tuning" / "default.json"
    (tmp_path / "default.json").write_text(shipped.read_text())
    measured = {
        ("GATED", "Q4_K", 4096): LaunchShape(2, 8, 1, 3),  # what default.json says: left out
        ("SINGLE", "Q8_0", 4096): LaunchShape(1, 16, 2, 1),
        ("MULTI", "Q4_K", 1024): LaunchShape(1, 4, 1, 2),
    }
    path = write_overlay("86", measured, tmp_path)
    assert json.loads(path.read_text()) == {"gemv_int": {
        "shapes": {"MULTI": {"narrow": {"rows": 1, "warps": 4, "units": 1, "min_blocks": 2}}},
        "wide_by_format": {"SINGLE_Q8_0": {"rows": 1, "warps": 16, "units": 2, "min_blocks": 1}},
    }}  # fmt: skip
    tuned = for_arch("86", tmp_path)
    assert all(tuned.gemv_int_shape(k, n, f) == shape for (k, f, n), shape in measured.items())
    assert tuned.gemv_int_shape("MULTI", 4096, "Q8_0") == for_arch(None, tmp_path).gemv_int_shape(
        "MULTI", 4096, "Q8_0"
    )


def test_a_float_x_cut_sends_big_single_products_to_the_float_kernel(tmp_path: Path, monkeypatch) -> None:
    """`single_float_x` (H100 sweep: Q4_K o and down of 5,120-5,376 rows from 6,144 columns faster on float32 x,
    the 8B's 4,096-row down slower): from that size on gemv.gemv launches gemv.cu instead of gemv_int.cu; below
    it in either dimension, and for other formats, the int16-x kernel as before. An option's cut (A/B) is a width
    at any row count and wins over the table's, 0 turning it off."""
    from app.engine.kernels import gemv

    shipped = Path(gemv_int.__file__).parent / "tuning" / "default.json"
    assert for_arch("90").float_x_from("Q4_K") == (6144, 5120)  # what ships
    (tmp_path / "default.json").write_text(shipped.read_text())
    (tmp_path / "sm90.json").write_text(
        json.dumps({"gemv_int": {"single_float_x": {"Q6_K": {"from_cols": 8192, "from_rows": 1024}}}})
    )
    tuned = for_arch("90", tmp_path)
    assert tuned.float_x_from("Q6_K") == (8192, 1024) and tuned.float_x_from("Q8_0") is None

    launched: list[str] = []
    monkeypatch.setattr(gemv_int, "gemv_int", lambda *a, **k: launched.append("int"))
    monkeypatch.setattr(gemv, "sm_count", lambda: 132)
    monkeypatch.setattr(gemv, "get_kernel", lambda file, name, defines: file)
    monkeypatch.setattr(gemv, "launch", lambda kernel, *a, **k: launched.append(kernel))

    class Rows:  # x of one token: only its shape is read before the launch
        shape = (1, 0)

    def kernel_of(plan: GemvPlan, qtype_name: str, n_rows: int, n_cols: int) -> str:
        launched.clear()
        gemv.gemv(None, qtype_name, 210 * n_cols // 256, n_rows, n_cols, Rows(), None, plan=plan)
        return launched[-1]

    plan = GemvPlan(tuned)
    assert kernel_of(plan, "Q4_K", 5120, 6144) == "gemv.cu"  # the 27B's o
    assert kernel_of(plan, "Q4_K", 5376, 21504) == "gemv.cu"  # the 31B's down
    assert kernel_of(plan, "Q4_K", 4096, 12288) == "int"  # the 8B's down: fewer rows
    assert kernel_of(plan, "Q4_K", 5120, 5120) == "int"  # too narrow
    assert kernel_of(plan, "Q6_K", 2048, 8192) == "gemv.cu" and kernel_of(plan, "Q6_K", 2048, 4096) == "int"
    assert kernel_of(plan, "Q8_0", 5120, 17408) == "int"
    assert kernel_of(GemvPlan(tuned, float_x_from={"Q4_K": 0}), "Q4_K", 5120, 17408) == "int"
    assert kernel_of(GemvPlan(tuned, float_x_from={"Q4_K": 6144}), "Q4_K", 4096, 12288) == "gemv.cu"
    assert kernel_of(GemvPlan(tuned, int_x=False), "Q4_K", 4096, 4096) == "gemv.cu"
