"""gemv_q4r.cu (Q4_K repacked for the tensor cores) on the SIMT emulator.

Not marked `gpu`: these run in CI. q4r_pack writes the layout from the GGUF rows of one to three weights
stacked along the output, then the product runs on it: the nibble order each lane decodes, the scale
pairs shuffled from the lane that holds them, the staged x read by ldmatrix through the swizzle, the
partial row blocks and token tiles, and the column splits summed by the last block in split order are
all checked against the float64 product of the numpy dequantizers' weights. Weights, their scale pairs
and x pass through float16 on their way into the tensor cores, hence F16_TOL.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cuda_samples import F16_TOL, dequantize_oracle, fresh_rng, random_tensor, rel_err
from emulator import build, run

pytestmark = pytest.mark.slow  # each build compiles the kernel as host C++

# (m-tiles a warp, n-tiles, layout, gated activation or -1, further defines): weights staged in shared memory
# with x (Q4R_WSMEM=1, STAGES chunks) unless a build says otherwise
BUILDS = {"nt1": (2, 1, 0, -1, ()), "nt2": (2, 2, 0, -1, ()), "nt4": (1, 4, 0, -1, ()), "b_nt2": (2, 2, 1, -1, ()),
          "b_nt8": (1, 8, 1, -1, ()), "silu_nt2": (2, 2, 0, 0, ()), "gelu_b_nt4": (2, 4, 1, 1, ()),
          "nt2_s2": (2, 2, 0, -1, ("Q4R_STAGES=2",)), "nt2_registers": (2, 2, 0, -1, ("Q4R_WSMEM=0", "Q4R_STAGES=3")),
          "mt4_nt2": (4, 2, 0, -1, ()), "b_mt4_nt1": (4, 1, 1, -1, ())}  # fmt: skip


@pytest.fixture(scope="module")
def emulators(tmp_path_factory):
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            mt, nt, fmt, act, more = BUILDS[name]
            defines = (f"-DQ4R_MT={mt}", f"-DQ4R_NT={nt}", f"-DQ4R_FMT={fmt}", f"-DQ4R_ACT={act}",
                       *(f"-D{d}" for d in more))  # fmt: skip
            made[name] = build(tmp_path_factory, "q4r_main.cpp", defines)
        return made[name]

    return get


def spread_rows(tensor, every: int = 21) -> None:
    """Row r's d and dmin times 2^-(r % every): rows of one 16-row tile differ by up to 2^20."""
    blocks = tensor.data.reshape(tensor.shape[0], -1, 144)
    for r in range(tensor.shape[0]):
        for off in (0, 2):
            value = blocks[r, :, off : off + 2].copy().view(np.float16).astype(np.float32) * 2.0 ** -(r % every)
            blocks[r, :, off : off + 2] = value.astype(np.float16).view(np.uint8).reshape(-1, 2)


@pytest.mark.parametrize(("build_name", "rows", "cols", "n_tok", "splits", "with_bias"), [
    ("nt2", (48, 16, 32), 512, 11, 1, True),  # q/k/v-like: three weights, a partial row block
    ("nt2", (128,), 1024, 16, 3, False),  # three splits over 16 chunks: uneven, reduced in order
    ("nt1", (32,), 256, 1, 1, True),  # one token, one superblock
    ("nt1", (160, 32), 768, 5, 2, False),  # two splits, a row block past the end of the rows
    ("nt4", (64, 64), 512, 29, 4, True),  # four of four token tiles, one m-tile a warp
    # the byte layout: Q6_K (w = d sc (q - 32), signed scales), and Q4_K stacked with it (Q4_K_M's q/k/v)
    ("b_nt2", ("64q6",), 512, 9, 1, True),
    ("b_nt2", (48, 16, "32q6"), 768, 16, 3, False),
    ("b_nt8", ("160q6", 32), 512, 61, 2, True),
    # the pipeline's depth: two stages; four (the default) where splits of 1-2 chunks end before the first
    # stages fill
    ("nt2_s2", (64, 32), 768, 12, 2, True),
    ("b_nt2", (48, "32q6"), 512, 10, 5, False),
    # four 16-row tiles a warp (256 rows a block; gemv_q4r_times.py's q4r_mt4 rows): a partial second block
    ("mt4_nt2", (256, 64), 512, 13, 2, True),
    ("b_mt4_nt1", ("64q6", 32), 512, 7, 1, False),
    # the weight words in registers, WPF chunks ahead (Q4R_WSMEM=0: the A/B build)
    ("nt2_registers", (128,), 1024, 16, 3, True),
])  # fmt: skip
def test_gemv_q4r_emulated(request, emulators, tmp_path: Path, build_name, rows, cols, n_tok, splits, with_bias):
    _check(request, emulators(build_name), tmp_path, rows, cols, n_tok, splits, with_bias)


def test_gemv_q4r_emulated_rows_of_far_apart_scales(request, emulators, tmp_path: Path) -> None:
    """Each row has its own power-of-two factor: a row 2^20 below its tile's largest keeps float16's
    relative error (checked row by row)."""
    got, ref = _check(request, emulators("nt1"), tmp_path, (48,), 512, 3, 1, False, spread=True)
    for r in range(48):
        assert rel_err(got[:, r], ref[:, r]) < F16_TOL, f"row {r}"


def _check(request, exe: Path, tmp_path: Path, rows, cols, n_tok, splits, with_bias, spread: bool = False):
    """Random Q4_K weights of `rows` each (and x, a bias) through harness `exe`, against the float64
    product: (got, ref)."""
    rng, seed = fresh_rng(request.node.nodeid)
    tensors = [random_tensor("Q6_K" if str(r).endswith("q6") else "Q4_K", int(str(r).removesuffix("q6")), cols, rng)
               for r in rows]  # fmt: skip
    n_rows = sum(t.shape[0] for t in tensors)
    if spread:
        for t in tensors:
            spread_rows(t)
    for i, t in enumerate(tensors):
        t.data.tofile(tmp_path / f"w{i}.bin")
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    x.tofile(tmp_path / "x.bin")
    weights = np.concatenate([dequantize_oracle(t) for t in tensors])
    ref = x.astype(np.float64) @ weights.astype(np.float64).T
    if with_bias:
        bias = rng.standard_normal(n_rows).astype(np.float32)
        bias.tofile(tmp_path / "bias.bin")
        ref += bias
    run(exe, tmp_path, cols, n_tok, splits, *rows)
    got = np.fromfile(tmp_path / "y.bin", np.float32).reshape(n_tok, n_rows)
    assert not np.isnan(got).any(), f"seed={seed}: an output was never written"
    assert rel_err(got, ref) < F16_TOL, f"seed={seed}: {rel_err(got, ref)}"
    assert not np.fromfile(tmp_path / "counters.bin", np.int32).any(), "the split counters must be left zero"
    return got, ref


@pytest.mark.parametrize(("build_name", "rows", "cols", "n_tok", "splits", "act"), [
    ("nt2", (64, 64), 512, 13, 2, None),  # interleaved tiles, plain epilogue: [first | second] as stacked
    ("silu_nt2", (96, 96), 768, 16, 3, "silu"),  # a gate/up pair: act(gate) * up in the epilogue, split
    ("gelu_b_nt4", ("64q6", "64q6"), 512, 27, 1, "gelu_tanh"),  # the byte layout, Gemma's activation
])  # fmt: skip
def test_gemv_q4r_emulated_interleaved_pairs(request, emulators, tmp_path: Path, build_name, rows, cols, n_tok, splits,
                                             act) -> None:  # fmt: skip
    """Two weights' tiles alternating: the plain epilogue puts each output back in its place, the gated one
    writes act(gate) * up (float64 reference, the activation in float64)."""
    rng, seed = fresh_rng(request.node.nodeid)
    tensors = [random_tensor("Q6_K" if str(r).endswith("q6") else "Q4_K", int(str(r).removesuffix("q6")), cols, rng)
               for r in rows]  # fmt: skip
    for i, t in enumerate(tensors):
        t.data.tofile(tmp_path / f"w{i}.bin")
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    x.tofile(tmp_path / "x.bin")
    gate, up = (x.astype(np.float64) @ dequantize_oracle(t).astype(np.float64).T for t in tensors)
    run(emulators(build_name), tmp_path, cols, n_tok, splits, "interleave", *rows)
    if act is None:
        ref = np.concatenate([gate, up], axis=1)
    elif act == "silu":
        ref = gate / (1 + np.exp(-gate)) * up
    else:
        ref = 0.5 * gate * (1 + np.tanh(0.7978845608028654 * (gate + 0.044715 * gate**3))) * up
    got = np.fromfile(tmp_path / "y.bin", np.float32).reshape(ref.shape)
    assert not np.isnan(got).any(), f"seed={seed}: an output was never written"
    assert rel_err(got, ref) < 2 * F16_TOL, f"seed={seed}: {rel_err(got, ref)}"
