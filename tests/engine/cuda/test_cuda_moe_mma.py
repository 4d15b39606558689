"""moe_mma.cu (the routed experts' grouped products on tensor cores) on the GPU: against moe.cu's
moe_grouped on the same grouped pairs and against numpy, and the tiny Qwen3-MoE's prefill through it.

GPU tests (marked `gpu`, skipped without one). The emulator tests (test_emulated_moe_mma.py) check the
indexing everywhere; these check the real mma.sync, ldmatrix and the compiled decoders, and that
moe_experts sends a prefill to this kernel.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from cuda_samples import (
    F16_TOL,
    GATED_FACTOR,
    dequantize_oracle,
    expert_grouping,
    pair_groups,
    random_tensor,
    rel_err,
)

from app.engine.kernels import moe_mma
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/engine: model_harness
from model_harness import run_logits
from test_cuda_moe_model import QWEN3MOE, TOKENS, _tolerance

pytestmark = pytest.mark.gpu
COUNTS = [0, 1, 17, 300, 64, 65, 3, 0]  # pairs an expert: none, one, partial tiles, several, exact tiles
N_ROWS, N_COLS, K = 192, 512, 2


def _grouped_reference(qtype: str, w, x, per_pair: bool, order, offsets):
    """moe.cu's grouped product over the same pairs (the kernel moe_mma replaces at prefill sizes)."""
    from app.engine.kernels.moe import grouped_product

    return grouped_product(w, x, pair_groups(order, offsets, K), per_pair)


@pytest.mark.parametrize(("qtype", "per_pair", "with_bias"), [
    ("Q4_K", False, False), ("Q6_K", True, False), ("Q8_0", False, True), ("F16", True, False),
    ("BF16", False, True), ("Q5_K", True, False), ("MXFP4", False, True), ("NVFP4", True, False),
    ("IQ4_XS", False, False),
])  # fmt: skip
@pytest.mark.parametrize("shape", [moe_mma.SQUARE, moe_mma.FEW_PAIRS], ids=["64x64", "32x128"])
def test_moe_mma_matches_the_grouped_kernel_and_numpy(cuda, rng, qtype: str, per_pair: bool, with_bias: bool,
                                                      shape) -> None:  # fmt: skip
    import cupy as cp

    from app.engine.kernels.moe import upload_stacked

    n_exp = len(COUNTS)
    flat = random_tensor(qtype, n_exp * N_ROWS, N_COLS, rng)
    stacked = QuantizedTensor("w", flat.qtype, (n_exp, N_ROWS, N_COLS), flat.data)
    values = rng.standard_normal((n_exp, N_ROWS)).astype(np.float32)
    bias = QuantizedTensor.from_float("b", values, QUANT_TYPES["F32"]) if with_bias else None
    w = upload_stacked(stacked, bias)
    order, offsets = expert_grouping(COUNTS, K, rng)
    pairs = order.size
    x = rng.standard_normal((pairs if per_pair else pairs // K, N_COLS)).astype(np.float32)
    d_x, d_order, d_offsets = cp.asarray(x), cp.asarray(order), cp.asarray(offsets)
    y = cp.full((pairs, N_ROWS), cp.nan, cp.float32)
    got = cp.asnumpy(moe_mma.grouped_mma(w, d_x, per_pair, d_order, d_offsets, K, n_exp, y, shape))
    old = cp.asnumpy(_grouped_reference(qtype, w, d_x, per_pair, d_order, d_offsets))
    assert not np.isnan(got).any()
    assert rel_err(got, old) < F16_TOL
    weights = dequantize_oracle(flat).astype(np.float64).reshape(n_exp, N_ROWS, N_COLS)
    for e in range(n_exp):
        rows = slice(offsets[e], offsets[e + 1])
        if rows.start == rows.stop:
            continue
        src = np.arange(pairs)[rows] if per_pair else order[rows] // K
        ref = x[src].astype(np.float64) @ weights[e].T
        if bias is not None:
            ref += values[e]
        assert rel_err(got[rows], ref) < F16_TOL, f"expert {e} ({COUNTS[e]} pairs)"


def test_tiny_moe_prefill_runs_on_tensor_cores_and_matches_numpy(cuda, cpu, monkeypatch) -> None:
    """The tiny Qwen3-MoE (6 experts, top 2) on a 32-token prompt: ~11 pairs an expert, so every grouped
    product of the prefill goes to moe_mma, and the logits are numpy's within float16's margin
    (test_cuda_moe_model.py checks that these tokens route far from any tie)."""
    from app.engine.loader.weights import open_checkpoint
    from app.engine.models.registry import build_model

    calls: list[str] = []
    real = moe_mma.grouped_mma

    def spy(w, *args):
        calls.append(w.qtype_name)
        return real(w, *args)

    monkeypatch.setattr(moe_mma, "grouped_mma", spy)
    reference = run_logits(build_model(open_checkpoint(QWEN3MOE["gguf"]), cpu, 64), cpu, TOKENS, "prefill")
    model = build_model(open_checkpoint(QWEN3MOE["gguf"]), cuda, 64)
    calls.clear()  # only the prefill's products
    ours = run_logits(model, cuda, TOKENS, "prefill")
    assert len(calls) == 3 * len(model.layers)  # gate, up and down of every layer
    diff = np.abs(ours - reference).max()
    assert diff < _tolerance(reference), f"max |logit diff| {diff:.4g}"
    top2 = np.sort(reference, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * _tolerance(reference)
    assert (ours.argmax(-1) == reference.argmax(-1))[clear].all()


def test_moe_mma_in_a_graph_replays_each_routing(cuda, rng) -> None:
    """A prefill-sized MoE (moe_forward, its products on moe_mma) captured with programmatic launches, as
    the decode and prefill graphs capture, then replayed on new inputs and router logits: each replay gives
    the eager output, so the tile list is rebuilt on the device from each replay's routing (no pair count
    is baked into the graph) and each kernel waits for the one before it."""
    import cupy as cp

    from app.engine.kernels.moe import moe_forward, upload_stacked
    from app.engine.models.config import MoeSpec
    from app.engine.worker.decode_graphs import capture_buckets

    n_tok, hidden, ff, n_exp, used = 96, 256, 512, 16, 4
    assert moe_mma.serves("Q4_K", n_tok, used, n_exp, hidden)
    spec = MoeSpec(n_exp, used, ff)
    experts = []
    for rows, cols in ((ff, hidden), (ff, hidden), (hidden, ff)):
        flat = random_tensor("Q4_K", n_exp * rows, cols, rng)
        experts.append(upload_stacked(QuantizedTensor("w", flat.qtype, (n_exp, rows, cols), flat.data)))
    x, logits = cp.zeros((n_tok, hidden), cp.float32), cp.zeros((n_tok, n_exp), cp.float32)

    def stage(_: int) -> None:
        x.fill(0.5)
        logits.fill(0.0)

    cp.cuda.Device().synchronize()  # the side stream does not wait for the weights' uploads
    stream = cp.cuda.Stream(non_blocking=True)
    graph, output = capture_buckets([n_tok], lambda _: moe_forward(x, logits, spec, *experts), stream, stage)[n_tok]
    for replay in range(3):
        x.set(rng.standard_normal((n_tok, hidden)).astype(np.float32))
        logits.set((rng.standard_normal((n_tok, n_exp)) * (1 + replay)).astype(np.float32))
        cp.cuda.Device().synchronize()
        graph.launch(stream=stream)
        stream.synchronize()
        eager = cp.asnumpy(moe_forward(x, logits, spec, *experts))
        assert rel_err(cp.asnumpy(output), eager) < 1e-5, f"replay {replay}"


@pytest.fixture(scope="module")
def a3b_experts(cuda):
    """One Qwen3.5-35B-A3B layer's routed experts as its Q4_K_M file has them: 256 experts, hidden 2048,
    expert_ffn 512; gate and up Q4_K, down Q6_K."""
    from app.engine.kernels.moe import upload_stacked

    rng = np.random.default_rng(35)
    made = []
    for qtype, rows, cols in (("Q4_K", 512, 2048), ("Q4_K", 512, 2048), ("Q6_K", 2048, 512)):
        flat = random_tensor(qtype, 256 * rows, cols, rng)
        made.append(upload_stacked(QuantizedTensor("w", flat.qtype, (256, rows, cols), flat.data)))
    return made


@pytest.mark.parametrize("n_tok", [512, 2048])  # 16 and 64 pairs an expert: the two tile shapes
def test_moe_experts_at_the_35b_a3b_shape_match_the_grouped_path(cuda, rng, a3b_experts, monkeypatch, n_tok):
    """moe_experts on a prefill chunk of the 35B-A3B layer (every expert hit, uneven counts) on the tensor
    cores, against the same call on moe_grouped (the threshold out of reach)."""
    import cupy as cp

    from app.engine.kernels.moe import moe_experts
    from app.engine.models.config import MoeSpec

    spec = MoeSpec(256, 8, 512)
    assert moe_mma.serves("Q6_K", n_tok, 8, 256, 512)
    skew = rng.gamma(0.5, size=256)  # a trained router's uneven load: some experts many pairs, some none
    chosen = np.stack([rng.choice(256, 8, replace=False, p=skew / skew.sum()) for _ in range(n_tok)])
    weights = rng.dirichlet(np.ones(8), n_tok).astype(np.float32)
    args = (cp.asarray(rng.standard_normal((n_tok, 2048)).astype(np.float32)), cp.asarray(chosen.astype(np.int32)),
            cp.asarray(weights), spec, *a3b_experts)  # fmt: skip
    new = cp.asnumpy(moe_experts(*args))
    monkeypatch.setattr(moe_mma, "MIN_PAIRS_PER_EXPERT", 1 << 30)
    old = cp.asnumpy(moe_experts(*args))
    assert np.isfinite(new).all()
    assert rel_err(new, old) < GATED_FACTOR * F16_TOL
