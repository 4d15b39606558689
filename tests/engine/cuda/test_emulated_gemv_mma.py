"""gemv_mma.cu and gemv_mma2.cu (a few tokens times quantized weights on tensor cores) on the SIMT emulator.

Not marked `gpu`: these run in CI. The emulator runs mma.sync by its PTX fragment layout, so the
kernel's k-permutation (each lane of a quad decodes its own 32-weight unit), the stacking of up to
three weights, partial row tiles, partial column steps and partial token tiles are all checked
against the float64 product of the numpy dequantizers' weights. Weights and x pass through
float16 on their way into the tensor cores, hence F16_TOL. gemv_mma2.cu adds its own splits: row-warps
sharing the x staged in shared memory, column-warps summed at the end, and column splits across
blocks that add into a zeroed output.
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
    _check(request, emulators(build_name), tmp_path, BUILDS[build_name][0], rows, cols, n_tok, with_bias)


def _check(
    request: pytest.FixtureRequest, exe: Path, tmp_path: Path, formats, rows, cols: int, n_tok: int, with_bias: bool,
    *extra_args: object,
) -> None:  # fmt: skip
    """Random weights of `formats` (`rows` each, 0: absent) and x through harness `exe`, against the
    float64 product; `extra_args` follow the harness's common ones."""
    rng, seed = fresh_rng(request.node.nodeid)
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
    run(exe, tmp_path, cols, *rows, *row_bytes, n_tok, *extra_args)
    got = np.fromfile(tmp_path / "y.bin", np.float32).reshape(n_tok, sum(rows))
    assert not np.isnan(got).any(), f"seed={seed}: an output was never written"
    assert rel_err(got, ref) < F16_TOL, f"seed={seed}"


# gemv_mma2.cu: (formats of the three stacked weights, m-tiles a warp, n-tiles, row-warps, column-warps).
BUILDS2 = {
    "kquants": (("Q4_K", "Q4_K", "Q6_K"), 1, 2, 2, 2),
    "narrow": (("Q8_0", "Q6_K", "Q4_K"), 1, 1, 2, 4),
    "wide": (("Q6_K", "Q8_0", "Q5_K"), 2, 8, 2, 1),
    "mixed": (("Q5_K", "Q4_0", "F16"), 2, 4, 1, 2),
    "picked8": (("Q4_K", "Q4_K", "Q6_K"), 1, 1, 4, 2),  # pick_shape's builds for <= 8 and 33..64 tokens
    "picked64": (("Q4_K", "Q4_K", "Q6_K"), 2, 8, 4, 1),
    "uniform": (("Q4_K", "Q4_K", "Q4_K"), 1, 2, 4, 2),  # one format: the kernel's single inlined tile
    "picked8_32": (("Q8_0", "Q4_0", "Q8_0"), 1, 1, 4, 2),  # the <= 8-token shape on 32-weight blocks: any 32 columns
}


@pytest.fixture(scope="module")
def emulators2(tmp_path_factory) -> dict[str, Path]:
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            # A/B builds: "+xstage0" works x's sources out each super-step, "+fdec" decodes the integer codes in
            # float32 (GM_HDEC=0; by default they decode in float16 pairs)
            base, _, extra = name.partition("+")
            formats, mt, nt, rw, kw = BUILDS2[base]
            defines = tuple(f"-DGM_F{i}=Fmt{f}" for i, f in enumerate(formats))
            defines += {"": (), "xstage0": ("-DGM_XSTAGE=0",), "fdec": ("-DGM_HDEC=0",)}[extra]
            made[name] = build(tmp_path_factory, "mma_gemv2_main.cpp",
                               (*defines, f"-DGM_MT={mt}", f"-DGM_NT={nt}", f"-DGM_RW={rw}", f"-DGM_KW={kw}"))  # fmt: skip
        return made[name]

    return get  # type: ignore[return-value]


@pytest.mark.parametrize(("build_name", "rows", "cols", "n_tok", "splits", "with_bias"), [
    ("kquants", (40, 24, 17), 768, 9, 1, True),  # q/k/v-like: three weights, ragged row tiles of each
    ("kquants", (33, 0, 0), 1280, 16, 2, True),  # 5 steps over 2 column-warps and 2 splits: uneven
    ("narrow", (19, 45, 30), 768, 2, 1, False),  # 3 steps for 4 column-warps: one idles
    ("narrow", (64, 16, 8), 1536, 2, 3, True),  # three splits add into y; bias once
    ("wide", (37, 21, 50), 512, 64, 1, True),  # every token slot
    ("wide", (37, 21, 50), 512, 33, 2, False),  # five of eight token tiles, split columns
    ("mixed", (23, 40, 9), 1024, 29, 1, True),
    ("picked8", (130, 64, 70), 2048, 5, 4, True),
    ("picked64", (130, 64, 70), 1536, 64, 2, True),
    ("uniform", (70, 130, 33), 1024, 16, 2, True),  # three weights, each ragged, tiles found by index
    ("uniform", (200, 0, 0), 768, 11, 1, False),
    # the kept sources of staged x (XSource: up to two words a thread) move 128 columns a super-step: many of them,
    # a row past its last unit, padding tokens; and the A/B build that works them out each super-step
    ("narrow", (64, 16, 8), 4096, 2, 1, True),  # 16 super-steps, two words a thread
    ("picked8_32", (70, 30, 0), 2080, 3, 1, False),  # 65 units: the last super-step's words all but one past the row
    ("picked8+xstage0", (130, 64, 70), 2048, 5, 4, True),
    # the float32 decode of the integer codes (GM_HDEC=0): every integer format, one and eight n-tiles
    ("picked8+fdec", (130, 64, 70), 2048, 5, 4, True),
    ("mixed+fdec", (23, 40, 9), 1024, 29, 1, True),
    ("wide+fdec", (37, 21, 50), 512, 64, 1, True),
    ("picked8_32+fdec", (70, 30, 0), 2080, 3, 1, False),
])  # fmt: skip
def test_gemv_mma2_emulated(
    request: pytest.FixtureRequest, emulators2, tmp_path: Path, build_name: str, rows, cols: int, n_tok: int,
    splits: int, with_bias: bool,
) -> None:  # fmt: skip
    formats = BUILDS2[build_name.partition("+")[0]][0]
    _check(request, emulators2(build_name), tmp_path, formats, rows, cols, n_tok, with_bias, splits)
