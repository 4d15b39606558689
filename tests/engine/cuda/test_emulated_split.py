"""gemv_split.cu (FP8, NVFP4, MXFP4 safetensors layouts) on the CPU SIMT emulator, against the numpy oracle.

Not marked `gpu`: runs in CI. The codes and scales are laid out exactly as the GPU gets them
(weights.py uploads the checkpoint's bytes); the oracle is app/engine/quant/split.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cuda_samples import SPLIT_KINDS, fresh_rng, random_split_tensor, rel_err
from emulator import build as _build
from emulator import run as _run

from app.engine.kernels.gemv_split import CODES, ROWS_PER_WARP, SCALE_IDS, TOKEN_BUCKETS, SplitLayout


@pytest.fixture(scope="module")
def split_emu(tmp_path_factory) -> Path:
    return _build(tmp_path_factory, "split_main.cpp")


def _write(tensor, folder: Path) -> SplitLayout:
    layout = SplitLayout.of(tensor)
    tensor.data.tofile(folder / "codes.bin")
    np.ascontiguousarray(tensor.scales.raw).tofile(folder / "scales.bin")
    return layout


def _scale_args(layout: SplitLayout) -> list[object]:
    return [layout.scale_cols, *layout.group, repr(layout.global_scale)]


@pytest.mark.parametrize("n_tok", [1, 3, 8])
@pytest.mark.parametrize("kind", SPLIT_KINDS)
def test_gemv_split_emulated(
    request: pytest.FixtureRequest, split_emu: Path, tmp_path: Path, kind: str, n_tok: int
) -> None:
    rng, seed = fresh_rng(request.node.nodeid)
    rows, cols = 37, 384  # a partial last warp of rows; FP8 blocks of 128 rows cut at 37
    tensor = random_split_tensor(kind, rows, cols, rng)
    layout = _write(tensor, tmp_path)
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    bias = rng.standard_normal(rows).astype(np.float32)
    x.tofile(tmp_path / "x.bin")
    bias.tofile(tmp_path / "bias.bin")
    bucket = next(b for b in TOKEN_BUCKETS if b >= n_tok)
    codes = CODES[layout.qtype_name][0]
    _run(split_emu, "gemv", codes, SCALE_IDS[layout.scale_dtype], bucket, ROWS_PER_WARP[bucket], tmp_path, rows, cols,
         n_tok, layout.row_bytes, *_scale_args(layout))  # fmt: skip
    got = np.fromfile(tmp_path / "y.bin", np.float32).reshape(n_tok, rows)
    ref = x.astype(np.float64) @ tensor.dequantize().astype(np.float64).T + bias
    assert not np.isnan(got).any(), f"seed={seed}"
    assert rel_err(got, ref) < 1e-5, f"seed={seed}"


@pytest.mark.parametrize(("kind", "out", "with_ids"), [
    ("fp8-block", "f32", True), ("fp8-channel-bf16", "f16", False), ("fp8-tensor", "f32", False),
    ("nvfp4", "f32", True), ("nvfp4", "f16", False), ("mxfp4", "f32", False), ("mxfp4", "f16", True),
])  # fmt: skip
def test_dequant_split_emulated(
    request: pytest.FixtureRequest, split_emu: Path, tmp_path: Path, kind: str, out: str, with_ids: bool
) -> None:
    rng, seed = fresh_rng(request.node.nodeid)
    n_src, cols = 150, 256
    tensor = random_split_tensor(kind, n_src, cols, rng)
    layout = _write(tensor, tmp_path)
    ref_all = tensor.dequantize()
    if with_ids:
        ids = rng.integers(0, n_src, 13).astype(np.int32)
        ids.tofile(tmp_path / "ids.bin")
        n_out, offset, ref = len(ids), 0, ref_all[ids]
    else:
        n_out, offset = 29, 121  # rows across the 128-row FP8 block edge
        ref = ref_all[offset : offset + n_out]
    codes = CODES[layout.qtype_name][0]
    _run(split_emu, "dequant", codes, SCALE_IDS[layout.scale_dtype], out, tmp_path, n_src, cols, layout.row_bytes,
         *_scale_args(layout), n_out, offset)  # fmt: skip
    dtype = np.float32 if out == "f32" else np.float16
    got = np.fromfile(tmp_path / "y.bin", dtype).reshape(n_out, cols).astype(np.float32)
    if out == "f32":  # the same float32 products as the oracle: exact
        np.testing.assert_array_equal(got, ref, err_msg=f"seed={seed}")
    else:
        np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-6, err_msg=f"seed={seed}")
