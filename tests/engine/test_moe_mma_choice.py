"""Which grouped products kernels/moe.py sends to the tensor cores (kernels/moe_mma.py) and in which tile
shape: host-side decisions, checked without a GPU."""

from __future__ import annotations

import pytest

from app.engine.kernels import moe_mma

A3B = {"k": 8, "n_experts": 256}  # Qwen3.5-35B-A3B's routing


@pytest.mark.parametrize(("n_tok", "on_tensor_cores"), [
    (1, False), (32, False), (127, False),  # decode steps: moe_grouped reads each expert's weights once anyway
    (128, True), (512, True), (8192, True),  # 4 pairs an expert and more: prefill chunks
])  # fmt: skip
def test_prefill_chunks_go_to_the_tensor_cores_and_decode_steps_do_not(n_tok: int, on_tensor_cores: bool) -> None:
    assert moe_mma.serves("Q4_K", n_tok, n_cols=2048, **A3B) is on_tensor_cores


@pytest.mark.parametrize(("qtype", "n_cols", "why"), [
    ("FP8_E4M3", 2048, "a split format (codes and a scale grid apart): no block decoder"),
    ("MXFP4_SPLIT", 2048, "a split format: no block decoder"),
    ("Q8_0", 2000, "not whole 32-weight units"),
])  # fmt: skip
def test_formats_and_widths_the_kernel_cannot_take_stay_on_moe_grouped(qtype: str, n_cols: int, why: str) -> None:
    assert not moe_mma.serves(qtype, 8192, n_cols=n_cols, **A3B), why


@pytest.mark.parametrize("qtype", ["MXFP4", "NVFP4", "IQ4_NL", "IQ4_XS"])
def test_the_table_formats_prefill_on_the_tensor_cores(qtype: str) -> None:
    """GPT-OSS's MXFP4 experts among them: on moe_grouped's CUDA cores an 8,000-token prompt took 8 s (H100)."""
    assert moe_mma.serves(qtype, 8192, n_cols=2048, **A3B)
    assert not moe_mma.serves(qtype, 32, n_cols=2048, **A3B)  # a decode step stays on moe_grouped


def test_a_pair_count_past_the_grid_stays_on_moe_grouped() -> None:
    n_tok = (moe_mma.MAX_GRID_Y * moe_mma.SQUARE.pairs) // 8
    assert moe_mma.serves("Q4_K", n_tok // 2, n_cols=2048, **A3B)
    assert not moe_mma.serves("Q4_K", n_tok, n_cols=2048, **A3B)


def test_the_tile_shape_follows_the_pairs_an_expert() -> None:
    assert moe_mma.pick_shape(512 * 8, 256) == moe_mma.FEW_PAIRS  # 16 pairs an expert
    assert moe_mma.pick_shape(2047 * 8, 256) == moe_mma.FEW_PAIRS
    assert moe_mma.pick_shape(2048 * 8, 256) == moe_mma.SQUARE  # 64
    assert moe_mma.max_tiles(8192 * 8, 256, moe_mma.SQUARE) == 1024 + 256  # every expert's last tile partial


def test_grouped_mma_refuses_what_it_has_no_kernel_for() -> None:
    from app.engine.kernels.moe import StackedExperts

    experts = StackedExperts(None, "FP8_E4M3", 256, 512, 2048, 2048)
    with pytest.raises(ValueError, match="no decoder for FP8_E4M3"):
        moe_mma.grouped_mma(experts, None, False, None, None, 8, 256, None)
