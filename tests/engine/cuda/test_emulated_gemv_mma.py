"""gemv_mma.cu (a few tokens times quantized weights on tensor cores) on the SIMT emulator.

Not marked `gpu`: these run in CI. The emulator runs mma.sync by its PTX fragment layout, so the
kernel's k-permutation (each lane of a quad decodes its own 32-weight unit), the stacking of up to
three weights, partial row tiles, partial column steps and partial token tiles are all checked
against the float64 product of the numpy dequantizers' weights. Weights and x pass through
float16 on their way into the tensor cores, hence F16_TOL.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cuda_samples import F16_TOL, dequantize_oracle, fresh_rng, random_tensor, rel_err
from emulator import build, run

pytestmark = pytest.mark.slow  # each build compiles the kernel as host C++ (~20 s)

# (formats of the three stacked weights, m-tiles, n-tiles, warps): the builds the cases below use.
BUILDS = {
    "kquants": (("Q4_K", "Q4_K", "Q6_K"), 2, 1, 2),
    "blocks32": (("Q8_0", "Q5_1", "F16"), 1, 2, 4),
    "wide": (("Q5_K", "Q4_1", "BF16"), 1, 8, 1),
    "floats": (("F32", "Q4_0", "Q5_0"), 2, 4, 1),
}


@pytest.fixture(scope="module")
def emulators(tmp_path_factory) -> dict[str, Path]:
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            formats, mt, nt, warps = BUILDS[name]
            defines = tuple(f"-DGM_F{i}=Fmt{f}" for i, f in enumerate(formats))
            made[name] = build(tmp_path_factory, "mma_gemv_main.cpp",
                               (*defines, f"-DGM_MT={mt}", f"-DGM_NT={nt}", f"-DGM_WARPS={warps}"))  # fmt: skip
        return made[name]

    return get  # type: ignore[return-value]


@pytest.mark.parametrize(("build_name", "rows", "cols", "n_tok", "with_bias"), [
    ("kquants", (40, 24, 17), 768, 5, True),  # q/k/v-like: three weights, partial tiles of each
    ("kquants", (33, 0, 0), 512, 2, False),  # one weight, the smallest batch
    ("blocks32", (19, 8, 0), 608, 13, True),  # 19 units: the last 128-column step is partial
    ("wide", (21, 9, 16), 512, 37, False),  # five of eight token tiles, one m-tile
    ("floats", (7, 30, 12), 384, 29, True),
])  # fmt: skip
def test_gemv_mma_emulated(
    request: pytest.FixtureRequest, emulators, tmp_path: Path, build_name: str, rows, cols: int, n_tok: int,
    with_bias: bool,
) -> None:  # fmt: skip
    rng, seed = fresh_rng(request.node.nodeid)
    formats = BUILDS[build_name][0]
    tensors = [random_tensor(f, max(r, 1), cols, rng) for f, r in zip(formats, rows, strict=True)]
    row_bytes = [t.data.shape[1] for t in tensors]
    for i, (t, r) in enumerate(zip(tensors, rows, strict=True)):
        if r:
            t.data.tofile(tmp_path / f"w{i}.bin")
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    x.tofile(tmp_path / "x.bin")
    weights = np.concatenate([dequantize_oracle(t)[:r] for t, r in zip(tensors, rows, strict=True) if r])
    ref = x.astype(np.float64) @ weights.astype(np.float64).T
    if with_bias:
        bias = rng.standard_normal(sum(rows)).astype(np.float32)
        bias.tofile(tmp_path / "bias.bin")
        ref += bias
    run(emulators(build_name), tmp_path, cols, *rows, *row_bytes, n_tok)
    got = np.fromfile(tmp_path / "y.bin", np.float32).reshape(n_tok, sum(rows))
    assert not np.isnan(got).any(), f"seed={seed}: an output was never written"
    assert rel_err(got, ref) < F16_TOL, f"seed={seed}"
