"""The numba CPU kernels against the numpy oracle (quant/reference.py) and gguf-py's dequantizers.

Decoding must equal gguf-py bit for bit, arbitrary bytes included (the kernels use the oracle's
operations in its order). Products differ from `x @ dequantize(W).T` in float32 summation order
only: bounded by 1e-5 of the sum of |x| * |w| per output, far above rounding (~1e-7) and far below
any decoding slip (one wrong nibble moves an output by ~1e-2 of that sum).
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from app.engine.backend.cpu import CpuBackend
from app.engine.backend.cpu_fast.backend import GEMV_MAX_ROWS, FastCpuBackend
from app.engine.backend.cpu_fast.weights import FAST_FORMATS, FastWeight
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.reference import dequantize, random_blocks
from app.engine.quant.types import QUANT_TYPES

# numba compiles every format's kernels on a fresh clone (~2 minutes of CPU; its disk cache makes
# later runs take seconds): slow tier. The embedded model's formats run in the fast tier through
# every test that loads it.
pytestmark = pytest.mark.slow

FORMATS = sorted(FAST_FORMATS)
ROWS, COLS = 48, 512  # 2 super-blocks per row; 3 parallel tasks of rows


def tensor(name: str, rng: np.random.Generator, arbitrary: bool = False) -> QuantizedTensor:
    qtype = QUANT_TYPES[name]
    n_bytes = ROWS * qtype.row_bytes(COLS)
    if arbitrary:
        data = rng.integers(0, 256, size=n_bytes, dtype=np.uint8)
    else:
        data = random_blocks(qtype, ROWS * COLS // qtype.block_size, rng)
    return QuantizedTensor("w", qtype, (ROWS, COLS), data.reshape(ROWS, -1))


@pytest.mark.parametrize("name", FORMATS)
def test_decoding_equals_gguf_on_arbitrary_bytes(name: str) -> None:
    rng = np.random.default_rng(QUANT_TYPES[name].ggml_id)
    t = tensor(name, rng, arbitrary=True)
    weight = FastWeight(t)
    with np.errstate(invalid="ignore", over="ignore"):
        expected = gguf_dequantize(t.data, GGMLQuantizationType[name])
    tile = weight.tile(0, np.empty((ROWS, COLS), np.float32))
    np.testing.assert_array_equal(tile, expected)
    picked = np.array([5, 0, 47, 5])
    np.testing.assert_array_equal(weight.rows(picked), expected[picked])
    np.testing.assert_array_equal(weight.tile(7, np.empty((3, COLS), np.float32)), expected[7:10])


def _bound(x: np.ndarray, dense: np.ndarray) -> np.ndarray:
    return 1e-5 * (np.abs(x) @ np.abs(dense).T) + 1e-30


@pytest.mark.parametrize("n_x", [1, 2, 3, 5, 8, GEMV_MAX_ROWS, GEMV_MAX_ROWS + 1, 40])
@pytest.mark.parametrize("name", FORMATS)
def test_products_match_the_oracle(name: str, n_x: int) -> None:
    """A decode row (gemv), verify-sized chunks (gemm_rows) and prefill rows (tiles + BLAS) against
    numpy on the dequantized matrix."""
    rng = np.random.default_rng(QUANT_TYPES[name].ggml_id * 10 + n_x)
    t = tensor(name, rng)
    dense = dequantize(t.data, t.qtype)
    x = rng.standard_normal((n_x, COLS)).astype(np.float32)
    ours = FastCpuBackend().linear(x, FastCpuBackend().load_weight(t))
    expected = x.astype(np.float64) @ dense.T.astype(np.float64)
    assert ours.dtype == np.float32 and ours.shape == (n_x, ROWS)
    assert (np.abs(ours - expected) <= _bound(x, dense)).all(), np.abs(ours - expected).max()


@pytest.mark.parametrize("name", ["F16", "Q8_0"])
def test_rows_of_any_leading_shape_are_taken_as_the_reference_takes_them(name: str) -> None:
    """A [C, T, in] input (an audio encoder's conv output) gives [C, T, out], the 2-D product's rows."""
    rng = np.random.default_rng(QUANT_TYPES[name].ggml_id)
    backend = FastCpuBackend()
    weight = backend.load_weight(tensor(name, rng))
    x = rng.standard_normal((3, 5, COLS)).astype(np.float32)
    ours = backend.linear(x, weight)
    assert ours.shape == (3, 5, ROWS)
    np.testing.assert_array_equal(ours, backend.linear(x.reshape(15, COLS), weight).reshape(3, 5, ROWS))
    dense = dequantize(tensor(name, np.random.default_rng(QUANT_TYPES[name].ggml_id)).data, QUANT_TYPES[name])
    flat = x.reshape(15, COLS)
    assert (np.abs(ours.reshape(15, ROWS) - flat.astype(np.float64) @ dense.T) <= _bound(flat, dense)).all()


@pytest.mark.parametrize("name", FORMATS)
def test_few_row_products_equal_each_row_alone(name: str) -> None:
    """For 1..16 activation rows (a verify chunk of k + 1 tokens), the product that decodes each weight
    row once for all of them gives every row within the kernels' bound of that row's one-row product
    (gemv, which decodes in place) and of the oracle, and the same bits in a chunk of any size (a
    row's sums do not depend on the rows beside it)."""
    rng = np.random.default_rng(QUANT_TYPES[name].ggml_id + 1000)
    t = tensor(name, rng)
    dense = dequantize(t.data, t.qtype)
    fast = FastCpuBackend()
    weight = fast.load_weight(t)
    x = rng.standard_normal((GEMV_MAX_ROWS, COLS)).astype(np.float32)
    alone = np.concatenate([fast.linear(x[i : i + 1], weight) for i in range(len(x))])
    expected = x.astype(np.float64) @ dense.T.astype(np.float64)
    full = fast.linear(x, weight)
    for n in range(1, GEMV_MAX_ROWS + 1):
        ours = fast.linear(x[:n], weight)
        assert (np.abs(ours - alone[:n]) <= 2 * _bound(x[:n], dense)).all(), (n, np.abs(ours - alone[:n]).max())
        assert (np.abs(ours - expected[:n]) <= _bound(x[:n], dense)).all(), (n, np.abs(ours - expected[:n]).max())
        if n > 1:
            np.testing.assert_array_equal(ours, full[:n])
        shifted = fast.linear(x[GEMV_MAX_ROWS - n :], weight)  # the same rows at other places in a chunk
        if n > 1:
            np.testing.assert_array_equal(shifted, full[GEMV_MAX_ROWS - n :])


def test_fused_weights_with_biases_mixed_formats_and_batch_invariance() -> None:
    """q/k/v-style parts of different formats side by side, biases added per part; a row's result is
    the same bits in any chunk of 2..GEMV_MAX_ROWS rows (each row is its own dot product), and within
    the bound of its one-row (decode) result."""
    rng = np.random.default_rng(7)
    fast, ref = FastCpuBackend(), CpuBackend()
    parts = [tensor(name, rng) for name in ("Q5_0", "Q8_0", "Q6_K")]
    biases = [rng.standard_normal(ROWS).astype(np.float32), None, rng.standard_normal(ROWS).astype(np.float32)]
    fused = fast.fuse_linear([fast.load_weight(p) for p in parts], biases)
    fused_ref = ref.fuse_linear([ref.load_weight(p) for p in parts], biases)
    x = rng.standard_normal((GEMV_MAX_ROWS, COLS)).astype(np.float32)
    ours, expected = fast.linear(x, fused), ref.linear(x, fused_ref)
    dense = np.concatenate([dequantize(p.data, p.qtype) for p in parts])
    assert (np.abs(ours - expected) <= _bound(x, dense) + 1e-6).all()
    for i in range(len(x) - 1):
        np.testing.assert_array_equal(fast.linear(x[i : i + 2], fused)[0], ours[i])
        assert (np.abs(fast.linear(x[i : i + 1], fused)[0] - ours[i]) <= 2 * _bound(x[i], dense) + 1e-6).all()


def test_embedding_rows_and_float_matrices_fall_back() -> None:
    rng = np.random.default_rng(3)
    fast = FastCpuBackend()
    t = tensor("Q4_K", rng)
    ids = np.array([3, 3, 40], dtype=np.int32)
    np.testing.assert_array_equal(fast.embedding(fast.load_weight(t), ids), dequantize(t.data, t.qtype)[ids])
    f32 = QuantizedTensor.from_float("w", rng.standard_normal((4, 32)).astype(np.float32), QUANT_TYPES["F32"])
    weight = fast.load_weight(f32)
    assert not isinstance(weight, FastWeight)  # F32 matrices stay on the numpy path
    x = rng.standard_normal((2, 32)).astype(np.float32)
    np.testing.assert_allclose(fast.linear(x, weight), x @ f32.dequantize().T, rtol=1e-6, atol=1e-6)


def test_thread_count_is_checked() -> None:
    import numba

    with pytest.raises(ValueError, match="--threads must be between 1 and"):
        FastCpuBackend(numba.config.NUMBA_NUM_THREADS + 1)
    assert FastCpuBackend(1).threads == 1
