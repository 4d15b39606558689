"""moe_mma.cu (the routed experts' grouped products on tensor cores) on the SIMT emulator.

Not marked `gpu`: these run in CI. The emulator runs mma.sync and ldmatrix by their PTX fragment
layouts, so the device-side tile list, the gather of each pair's input through `order`, the
decode of each format's 128-column steps into shared memory, partial pair tiles, partial row tiles,
partial column steps and experts with no pairs are all checked against the float64 product of the
numpy dequantizers' weights, expert by expert. Weights and inputs pass through float16 on their way
into the tensor cores, hence F16_TOL.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cuda_samples import F16_TOL, dequantize_oracle, expert_grouping, fresh_rng, random_tensor, rel_err
from emulator import build, run

from app.engine.kernels.moe_mma import FEW_PAIRS, FORMATS, SQUARE, TileShape

pytestmark = pytest.mark.slow  # the build compiles every format's kernel as host C++


@pytest.fixture(scope="module")
def emulators(tmp_path_factory):
    """The harness built for a tile shape (each compiles every format's kernel)."""
    made: dict[TileShape, Path] = {}

    def get(shape: TileShape) -> Path:
        if shape not in made:
            made[shape] = build(tmp_path_factory, "moe_mma_main.cpp", (f"-DMMA_BM={shape.pairs}", f"-DMMA_BN={shape.rows}"))
        return made[shape]

    return get


def _run_case(emu: Path, shape: TileShape, tmp_path: Path, request, qtype: str, counts: list[int], n_rows: int,
              n_cols: int, per_pair: bool, with_bias: bool, k: int = 2, skipped: int = 0,
              magnitudes: tuple[float, ...] = ()) -> None:  # fmt: skip
    """The product of every expert's pairs, against numpy; `skipped` pairs in one more group than
    there are experts (the streamed experts' call) stay unwritten. `magnitudes`: each input row scaled
    by one of them, and every output row checked on its own."""
    rng, seed = fresh_rng(request.node.nodeid)
    n_exp = len(counts)
    stacked = random_tensor(qtype, n_exp * n_rows, n_cols, rng)
    weights = dequantize_oracle(stacked).astype(np.float64).reshape(n_exp, n_rows, n_cols)
    order, offsets = expert_grouping([*counts, skipped], k, rng)
    pairs = order.size
    x = rng.standard_normal((pairs if per_pair else pairs // k, n_cols))
    if magnitudes:
        x *= rng.choice(magnitudes, (len(x), 1))
    x = x.astype(np.float32)
    bias = rng.standard_normal((n_exp, n_rows)).astype(np.float32) if with_bias else None
    stacked.data.tofile(tmp_path / "w.bin")
    x.tofile(tmp_path / "x.bin")
    order.tofile(tmp_path / "order.bin")
    offsets.tofile(tmp_path / "offsets.bin")
    if bias is not None:
        bias.tofile(tmp_path / "bias.bin")
    run(emu, "moe_mma", qtype.lower(), tmp_path, n_exp, n_rows, n_cols, stacked.data.shape[1], k, int(per_pair),
        pairs)  # fmt: skip
    y = np.fromfile(tmp_path / "y.bin", np.float32).reshape(pairs, n_rows)
    tiles = np.fromfile(tmp_path / "tiles.bin", np.int32)
    assert tiles[0] == sum(-(-c // shape.pairs) for c in counts), f"seed={seed}: tile count {tiles[0]}"
    for e in range(n_exp):
        rows = slice(offsets[e], offsets[e + 1])
        src = np.arange(pairs)[rows] if per_pair else order[rows] // k
        ref = x[src].astype(np.float64) @ weights[e].T + (0.0 if bias is None else bias[e])
        got = y[rows]
        assert not np.isnan(got).any(), f"seed={seed}: expert {e}: an output was never written"
        if counts[e]:
            assert rel_err(got, ref) < F16_TOL, f"seed={seed}: expert {e} ({counts[e]} pairs)"
        for row, (got_row, ref_row) in enumerate(zip(got, ref, strict=True) if magnitudes else ()):
            if not ref_row.any():
                assert not got_row.any(), f"seed={seed}: expert {e}, pair {row}: a zero input's product"
            else:
                assert rel_err(got_row, ref_row) < F16_TOL, f"seed={seed}: expert {e}, pair {row}, {ref_row[:2]}"
    assert np.isnan(y[offsets[n_exp] :]).all(), f"seed={seed}: a skipped pair was written"


@pytest.mark.parametrize(("qtype", "counts", "n_rows", "n_cols", "per_pair", "with_bias"), [
    ("Q4_K", [0, 1, 17, 300], 80, 512, False, True),  # the brief's counts; a partial second row tile
    ("Q6_K", [300, 0, 17, 1], 64, 256, True, False),  # per-pair inputs (the down product)
    ("Q8_0", [3, 70, 0, 1], 40, 608, False, False),  # 19 units: the last 128-column step is partial
    ("F16", [65, 0, 9], 24, 256, True, True),
    ("Q4_0", [30, 2, 0, 40], 64, 32, True, False),  # one unit a row (the tiny qwen3moe's down product)
])  # fmt: skip
@pytest.mark.parametrize("shape", [SQUARE, FEW_PAIRS], ids=["64x64", "32x128"])
def test_moe_mma_emulated(emulators, shape, tmp_path, request, qtype, counts, n_rows, n_cols, per_pair, with_bias):
    _run_case(emulators(shape), shape, tmp_path, request, qtype, counts, n_rows, n_cols, per_pair, with_bias)


@pytest.mark.parametrize("qtype", sorted(FORMATS - {"Q4_K", "Q6_K", "Q8_0", "F16"}))
def test_moe_mma_formats_emulated(emulators, tmp_path, request, qtype):
    """Every other format the kernel decodes, on a small case: two experts, a partial tile and two tiles
    and a partial one, rows 16 of a 128-row tile."""
    _run_case(emulators(FEW_PAIRS), FEW_PAIRS, tmp_path, request, qtype, [5, 67], 16, 256, False, False)


def test_moe_mma_skipped_group_emulated(emulators, tmp_path, request):
    """Pairs in the group past the last expert (experts not in slots, kernels/moe.py's `groups`) are
    never written: moe_experts leaves their rows at zero."""
    _run_case(emulators(SQUARE), SQUARE, tmp_path, request, "Q4_K", [8, 0, 21], 32, 256, False, False, k=4, skipped=11)


def test_moe_mma_many_experts_emulated(emulators, tmp_path, request):
    """More experts than the tile-list kernel has threads (the harness launches 64): each thread places
    several experts' tiles, after every earlier expert's."""
    rng, _ = fresh_rng(request.node.nodeid + "counts")
    counts = [int(c) for c in rng.choice([0, 1, 2, 33, 40], 150)]
    counts[-1] += sum(counts) % 2  # whole tokens of k = 2
    _run_case(emulators(FEW_PAIRS), FEW_PAIRS, tmp_path, request, "Q8_0", counts, 8, 32, True, False)


@pytest.mark.parametrize("shape", [SQUARE, FEW_PAIRS], ids=["64x64", "32x128"])
def test_moe_mma_inputs_of_any_magnitude_emulated(emulators, shape, tmp_path, request):
    """Input rows far outside float16's range (1e7: it ends at 65504) or deep in its subnormals (1e-9), rows
    of zeros and ordinary ones side by side: each row is scaled by its own power of two on the way into
    float16, so every pair's product keeps float16's relative precision."""
    _run_case(emulators(shape), shape, tmp_path, request, "Q4_K", [40, 3, 29], 48, 256, True, False,
              magnitudes=(1e7, 3e4, 1.0, 1e-9, 0.0))  # fmt: skip
