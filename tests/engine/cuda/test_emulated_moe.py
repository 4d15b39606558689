"""moe.cu's pipeline (route, group by expert, grouped products, gated unit, combine) on the SIMT
emulator, against the numpy MoE layer (layers/moe.py) on the same checkpoint tensors.

Not marked `gpu`: the emulator runs the kernels as host threads. Stacked expert weights come in
the formats the kernels decode straight from their blocks (quant.cuh); the three routings (softmax then
top k, GPT-OSS's top k then softmax, Laguna's biased sigmoid scores on capped logits) and the three
activations (SiLU, GPT-OSS's clamped SwiGLU with its biases, Gemma 4's GELU-tanh) are covered, at a small
shape and at the pair sets of decode (one token, top 8 of 256) and of a 32-token batch (256 pairs over 256
experts: most experts one pair, some several), with each build of the products' pairs per pass (MOE_TMAX),
both groupings (one block; many pairs), gate and up apart, and pairs skipped (expert streaming's slots).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from cuda_samples import GATED_FACTOR, INT_X_TOL, fresh_rng, random_tensor, rel_err
from emulator import build as _build
from emulator import run as _run
from moe_files import write_moe_inputs

from app.engine.backend.cpu import CpuBackend
from app.engine.kernels.moe import ACTIVATION_KINDS, ROUTING_MODES
from app.engine.layers.moe import MoE
from app.engine.models.config import MoeSpec
from app.engine.moe.ops import expert_forward, route, sum_over_experts
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES

pytestmark = pytest.mark.slow  # ~1 min together: kernels run thread by thread on the CPU
P = "blk.0"


class Shape(NamedTuple):
    tokens: int
    experts: int
    used: int
    hidden: int = 64
    ff: int = 32


SMALL = Shape(7, 6, 2)
DECODE = Shape(1, 256, 8)  # Qwen3.5-35B-A3B's routing at one token: 8 experts of 256, one pair each
DECODE_K = Shape(1, 256, 8, hidden=256, ff=256)  # the same in k-quant blocks (256 weights a block)
BATCH32 = Shape(32, 256, 8)  # 256 pairs: nearly every expert hit, a few twice or more
WIDE = Shape(5, 16, 4, hidden=1024, ff=96)  # 32 units a row (whole warps) and 3 (lane groups of 2)
WIDE_K = Shape(5, 16, 4, hidden=1024, ff=256)  # 32 units and 8 (lane groups of 8)


def _id(value: object) -> str | None:
    """Test ids: a shape as tokens x experts top k (h hidden, f ff); other values pytest's own."""
    if isinstance(value, Shape):
        return f"{value.tokens}t-{value.experts}e-top{value.used}-h{value.hidden}-f{value.ff}"
    return None


@pytest.fixture(scope="module")
def moe_emu(tmp_path_factory) -> Path:
    return _build(tmp_path_factory, "moe_main.cpp")


@pytest.fixture(scope="module")
def moe_emu_builds(tmp_path_factory) -> dict[tuple[int, int], Path]:
    """The harness per (MOE_TMAX, MOE_R): the products' pairs per pass (4 is moe.cu's default) and the rows of
    each weight a lane group reads (2 is the default; 4 the A/B build, on grids sized for 2)."""
    builds = ((1, 2), (2, 2), (1, 4), (2, 4))
    return {(t, r): _build(tmp_path_factory, "moe_main.cpp", (f"-DMOE_TMAX={t}", f"-DMOE_R={r}")) for t, r in builds}


def _stacked(qtype: str, shape: Shape, rows: int, cols: int, rng, name: str) -> QuantizedTensor:
    flat = random_tensor(qtype, shape.experts * rows, cols, rng, name)
    return QuantizedTensor(name, flat.qtype, (shape.experts, rows, cols), flat.data)


def _f32(name: str, values: np.ndarray) -> QuantizedTensor:
    return QuantizedTensor.from_float(name, values.astype(np.float32), QUANT_TYPES["F32"])


def _tensors(qtype: str, shape: Shape, spec: MoeSpec, rng, router_scale: float = 1 / 8) -> dict[str, QuantizedTensor]:
    """A MoE layer's GGUF tensors: router, stacked experts (no gate for relu2), GPT-OSS's biases, the score bias."""
    h, ff, e = shape.hidden, shape.ff, shape.experts
    tensors = {f"{P}.ffn_gate_inp.weight": _f32("router", rng.standard_normal((e, h)) * router_scale)}
    parts = (("up", ff, h), ("down", h, ff)) if spec.activation == "relu2" else (
        ("gate", ff, h), ("up", ff, h), ("down", h, ff))  # fmt: skip
    for part, rows, cols in parts:
        tensors[f"{P}.ffn_{part}_exps.weight"] = _stacked(qtype, shape, rows, cols, rng, part)
    if spec.activation == "swiglu_oai":
        for part, rows in (("gate", ff), ("up", ff), ("down", h)):
            tensors[f"{P}.ffn_{part}_exps.bias"] = _f32(part, rng.standard_normal((e, rows)) * 0.1)
    return tensors


def _run_pipeline(exe: Path, tmp_path: Path, qtype: str, shape: Shape, spec: MoeSpec, tensors: dict, x: np.ndarray,
                  logits: np.ndarray, score_bias: np.ndarray | None, *variant: int) -> None:  # fmt: skip
    """Write the inputs, run the harness's `moe` (variant: MANY_PAIRS, SEPARATE, FUSED_ROUTE)."""
    write_moe_inputs(tmp_path, tensors, P, x, logits, score_bias)
    row_gu = tensors[f"{P}.ffn_up_exps.weight"].data.shape[1]
    row_d = tensors[f"{P}.ffn_down_exps.weight"].data.shape[1]
    _run(exe, "moe", qtype.lower(), tmp_path, shape.tokens, shape.hidden, shape.ff, shape.experts, shape.used,
         ROUTING_MODES[spec.routing], int(spec.normalize), ACTIVATION_KINDS[spec.activation], row_gu, row_d,
         spec.router_softcap, spec.routed_scale, spec.num_groups, spec.topk_groups, *variant)  # fmt: skip


def _case(exe: Path, tmp_path: Path, rng, qtype: str, shape: Shape, spec: MoeSpec, *variant: int,
          score_bias: bool = False, router_scale: float = 1 / 8) -> tuple[MoE, np.ndarray, np.ndarray]:  # fmt: skip
    """Run a random layer through the harness; (the numpy layer, its logits, its output)."""
    tensors = _tensors(qtype, shape, spec, rng, router_scale)
    if score_bias:
        tensors[f"{P}.exp_probs_b.bias"] = _f32("score_bias", rng.standard_normal(shape.experts) * 0.3)
    layer = MoE(CpuBackend(), tensors, P, spec)
    x = rng.standard_normal((shape.tokens, shape.hidden)).astype(np.float32)
    logits = layer.router(x)
    _run_pipeline(exe, tmp_path, qtype, shape, spec, tensors, x, logits, layer.score_bias, *variant)
    return layer, logits, layer(x)


# Laguna's router: sigmoid scores chosen with a per-expert bias, weighed sum-normalised times a scale, on
# tanh-capped logits.
LAGUNA = dict(routing="sigmoid_grouped", routed_scale=1.5, router_softcap=0.5)


@pytest.mark.parametrize(("qtype", "activation", "routing"), [
    ("Q8_0", "silu", {}), ("F16", "swiglu_oai", {}), ("BF16", "silu", {}), ("Q4_0", "swiglu_oai", {}),
    ("Q8_0", "gelu_tanh", {}), ("Q8_0", "silu", LAGUNA), ("BF16", "silu", dict(LAGUNA, router_softcap=0.0)),
])  # fmt: skip
def test_moe_pipeline_emulated(moe_emu, tmp_path, request, qtype, activation, routing):
    rng, seed = fresh_rng(request.node.nodeid)
    gpt_oss = activation == "swiglu_oai"
    spec = MoeSpec(SMALL.experts, SMALL.used, SMALL.ff,
                   **({"routing": "topk_softmax", "normalize": False} if gpt_oss else routing),
                   activation=activation)  # fmt: skip
    layer, logits, expected = _case(moe_emu, tmp_path, rng, qtype, SMALL, spec,
                                    score_bias=spec.routing == "sigmoid_grouped")  # fmt: skip
    _check_outputs(tmp_path, SMALL, layer, logits, spec, expected, seed)


@pytest.mark.parametrize(("qtype", "groups", "topk_groups", "bias", "normalize", "scale", "softcap", "fused"), [
    ("Q8_0", 1, 1, True, True, 2.5, 0.0, 0),  # Nemotron-H: one group, the choice bias, renormalised and scaled
    ("BF16", 3, 2, True, False, 1.0, 0.0, 0),  # group-limited: only the two best of three groups compete
    ("F16", 2, 1, False, True, 1.5, 0.0, 1),
    ("Q8_0", 3, 2, True, True, 2.0, 0.5, 0),  # every sigmoid option at once: groups, bias, softcap, scale
    ("Q8_0", 3, 2, True, True, 2.0, 0.5, 1),  # the same, routed and grouped in one launch (moe_route_grouped)
])  # fmt: skip
def test_sigmoid_routed_ungated_experts_emulated(moe_emu, tmp_path, request, qtype, groups, topk_groups, bias,
                                                 normalize, scale, softcap, fused):  # fmt: skip
    """Nemotron-H's experts: moe_route's sigmoid mode (sigmoid scores, the choice on scores + bias within the
    best groups; the one router kernel Laguna's one-group routing takes too) and squared-ReLU experts with no
    gate product (the activation inside the up product), against the numpy layer."""
    rng, seed = fresh_rng(request.node.nodeid)
    spec = MoeSpec(SMALL.experts, SMALL.used, SMALL.ff, routing="sigmoid_grouped", normalize=normalize,
                   num_groups=groups, topk_groups=topk_groups, routed_scale=scale, router_softcap=softcap,
                   activation="relu2")  # fmt: skip
    layer, logits, expected = _case(moe_emu, tmp_path, rng, qtype, SMALL, spec, *((0, 0, 1) if fused else ()),
                                    score_bias=bias, router_scale=1 / 4)  # fmt: skip
    _check_outputs(tmp_path, SMALL, layer, logits, spec, expected, seed)


def _pair_set_spec(shape: Shape, activation: str) -> MoeSpec:
    """The pair-set tests' layer: GPT-OSS's routing with its activation, else softmax then top k renormalised."""
    gpt_oss = activation == "swiglu_oai"
    return MoeSpec(shape.experts, shape.used, shape.ff, routing="topk_softmax" if gpt_oss else "softmax_topk",
                   normalize=not gpt_oss, activation=activation)  # fmt: skip


def _pair_set_build(moe_emu: Path, builds: dict[tuple[int, int], Path], tmax: int | tuple[int, int]) -> Path:
    """The harness built for `tmax` (MOE_TMAX, or a pair (MOE_TMAX, MOE_R))."""
    build = tmax if isinstance(tmax, tuple) else (tmax, 2)
    return moe_emu if build == (4, 2) else builds[build]


@pytest.mark.parametrize(("shape", "qtype", "activation", "tmax", "variant"), [
    (DECODE_K, "Q4_K", "silu", 1, (0, 0, 1)),  # a decode step as moe_forward runs it: route and group at once,
    (DECODE_K, "Q6_K", "silu", 1, ()),  # the build kernels/moe.py picks for one pair an expert
    (DECODE, "Q8_0", "swiglu_oai", 4, ()),
    (BATCH32, "Q8_0", "silu", 1, (0, 0, 1)),  # several pairs of an expert, one pass each
    (BATCH32, "Q4_0", "silu", 2, ()),
    (BATCH32, "Q4_0", "gelu_tanh", 2, ()),
    (BATCH32, "Q5_1", "silu", 4, (1, 0, 0)),  # the grouping of many pairs: moe_count, moe_offsets, moe_scatter
    (BATCH32, "F16", "swiglu_oai", 4, (0, 1, 0)),  # gate and up as two products, then moe_gated
    (BATCH32, "Q8_0", "relu2", 2, ()),
    (WIDE, "Q8_0", "silu", 4, (0, 0, 1)),  # 5 tokens: 5 of the block's 32 warps route one each
    (WIDE, "BF16", "swiglu_oai", 1, (1, 1, 0)),
    (WIDE_K, "Q4_K", "silu", 2, ()),
    (WIDE_K, "Q5_K", "silu", 4, ()),
    (WIDE_K, "Q6_K", "gelu_tanh", 1, ()),
    (DECODE_K, "Q4_K", "silu", (1, 4), (0, 0, 1)),  # four rows a lane group (MOE_R=4)
    (BATCH32, "Q8_0", "silu", (2, 4), ()),
    (WIDE_K, "Q4_K", "gelu_tanh", (2, 4), (0, 1, 0)),
    (WIDE, "Q8_0", "swiglu_oai", (1, 4), (1, 1, 0)),
], ids=_id)  # fmt: skip
def test_moe_pair_sets_emulated(moe_emu, moe_emu_builds, tmp_path, request, shape, qtype, activation, tmax, variant):
    """The pair sets of decode and of small batches (top 8 of 256 experts), every build of the products'
    pairs per pass (`tmax`; a pair (tmax, rows) also sets the rows a lane group reads), both groupings and the
    unfused gate/up, against the numpy layer."""
    rng, seed = fresh_rng(request.node.nodeid)
    spec, exe = _pair_set_spec(shape, activation), _pair_set_build(moe_emu, moe_emu_builds, tmax)
    layer, logits, expected = _case(exe, tmp_path, rng, qtype, shape, spec, *variant)
    _check_outputs(tmp_path, shape, layer, logits, spec, expected, seed)


@pytest.mark.parametrize(("shape", "qtype", "activation", "tmax", "variant"), [
    (DECODE_K, "Q4_K", "silu", 1, (0, 0, 1)),  # a decode step's pair set, routed and grouped at once
    (BATCH32, "Q8_0", "silu", 2, (0, 0, 1)),  # signed codes
    (BATCH32, "Q5_0", "gelu_tanh", 2, ()),  # Gemma-4-26B-A4B's down format, its GELU experts
    (BATCH32, "Q4_1", "silu", 4, (1, 0, 0)),  # offsets from many pairs; affine codes (w = d q + m)
    (BATCH32, "Q8_0", "relu2", 2, ()),  # ungated: the activation inside the up product
    (BATCH32, "MXFP4", "swiglu_oai", 4, ()),  # GPT-OSS: table codes, biases, clamped SwiGLU
    (WIDE, "IQ4_NL", "silu", 1, (0, 1, 0)),  # gate and up as two products, then moe_gated
    (WIDE_K, "Q6_K", "silu", 4, ()),
    (WIDE_K, "Q5_K", "silu", 2, ()),
    (WIDE_K, "NVFP4", "silu", 1, ()),
    (WIDE_K, "IQ4_XS", "silu", 2, ()),
    (DECODE_K, "Q4_K", "silu", (1, 4), (0, 0, 1)),  # four rows a lane group (MOE_R=4)
], ids=_id)  # fmt: skip
def test_int_x_products_emulated(moe_emu, moe_emu_builds, tmp_path, request, shape, qtype, activation, tmax, variant):
    """The grouped products over int16 x (KernelOptions.moe_int_x: moe_xq, then moe_grouped[_gated]_int_<fmt>) at
    decode and small-batch pair sets, every format with integer codes' decoder, against the numpy layer: the
    inputs rounded per 16 columns to int16 (gemv_int's x), so within its margin."""
    rng, seed = fresh_rng(request.node.nodeid)
    spec, exe = _pair_set_spec(shape, activation), _pair_set_build(moe_emu, moe_emu_builds, tmax)
    flags = (*variant, *(0,) * (3 - len(variant)), 0, 1)  # MANY_PAIRS SEPARATE FUSED_ROUTE FUSED_DECODE INT_X
    layer, logits, expected = _case(exe, tmp_path, rng, qtype, shape, spec, *flags)
    _check_outputs(tmp_path, shape, layer, logits, spec, expected, seed, tol=GATED_FACTOR * INT_X_TOL)
    err = rel_err(np.fromfile(tmp_path / "out.bin", np.float32).reshape(expected.shape), expected)
    assert err > 1e-6, f"seed {seed}: rel err {err:.3g}, float32 x's (the int16 rounding leaves ~1e-5)"


@pytest.mark.parametrize(("shape", "variant"), [(DECODE, (0, 0, 1)), (SMALL, ())], ids=_id)
def test_expert_scale_in_the_combine_emulated(moe_emu, tmp_path, request, shape, variant):
    """Gemma 4's factor per expert's output (`ffn_down_exps.scale`), applied to the weights in moe_combine."""
    rng, seed = fresh_rng(request.node.nodeid)
    spec = MoeSpec(shape.experts, shape.used, shape.ff, activation="gelu_tanh")
    tensors = _tensors("Q8_0", shape, spec, rng)
    tensors[f"{P}.ffn_down_exps.scale"] = _f32("scale", rng.uniform(0.5, 1.5, shape.experts))
    layer = MoE(CpuBackend(), tensors, P, spec)
    assert layer.expert_scale is not None
    x = rng.standard_normal((shape.tokens, shape.hidden)).astype(np.float32)
    logits = layer.router(x)
    _run_pipeline(moe_emu, tmp_path, "Q8_0", shape, spec, tensors, x, logits, None, *variant)
    out = np.fromfile(tmp_path / "out.bin", np.float32).reshape(shape.tokens, shape.hidden)
    expected = layer(x)
    assert rel_err(out, expected) < 1e-5, f"seed {seed}: rel err {rel_err(out, expected):.3g}"


@pytest.mark.parametrize(("shape", "variant"), [
    (BATCH32, ()), (BATCH32, (1, 0, 0)), (SMALL, (0, 1, 0)), (BATCH32, (0, 0, 0, 0, 1)),  # the last over int16 x
], ids=_id)  # fmt: skip
def test_skipped_pairs_emulated(moe_emu, tmp_path, request, shape, variant):
    """Expert streaming's pass (backend/cuda/experts.py): pairs whose group is one past the last slot are
    skipped (their outputs 0), the rest read their slot; the output is the layer's sum over the pairs kept."""
    rng, seed = fresh_rng(request.node.nodeid)
    spec = MoeSpec(shape.experts, shape.used, shape.ff, activation="silu")
    tensors = _tensors("Q8_0", shape, spec, rng)
    layer = MoE(CpuBackend(), tensors, P, spec)
    x = rng.standard_normal((shape.tokens, shape.hidden)).astype(np.float32)
    logits = layer.router(x)
    weights, chosen = route(np, logits, spec)
    kept = rng.random(shape.experts) < 0.5  # the experts "in slots" this pass
    groups = np.where(kept[chosen], chosen, shape.experts).astype(np.int32)
    (tmp_path / "groups.bin").write_bytes(groups.tobytes())
    _run_pipeline(moe_emu, tmp_path, "Q8_0", shape, spec, tensors, x, logits, None, *variant)

    def run(expert: int, rows: np.ndarray) -> np.ndarray:
        down = layer.down[expert]
        return expert_forward(layer.backend, spec, layer.gate_up[expert], down.weight, down.bias, rows)

    expected = sum_over_experts(layer.backend, x, np.where(kept[chosen], weights, 0.0), chosen, spec, run)
    out = np.fromfile(tmp_path / "out.bin", np.float32).reshape(shape.tokens, shape.hidden)
    assert 0 < kept[chosen].sum() < chosen.size, f"seed {seed}: the case skips some pairs and keeps some"
    tol = GATED_FACTOR * INT_X_TOL if variant[4:] == (1,) else 1e-5
    assert rel_err(out, expected) < tol, f"seed {seed}: rel err {rel_err(out, expected):.3g}"


def _check_outputs(tmp_path: Path, shape: Shape, layer: MoE, logits: np.ndarray, spec: MoeSpec,
                   expected: np.ndarray, seed: int, tol: float = 1e-5):  # fmt: skip
    """The emulated route's experts and weights equal the numpy router's, and the output the layer's (within `tol`)."""
    chosen = np.fromfile(tmp_path / "chosen.bin", np.int32).reshape(shape.tokens, shape.used)
    weights, want = route(np, logits, spec, layer.score_bias)
    assert (chosen == want).all(), f"seed {seed}: experts {chosen.tolist()} != {want.tolist()}"
    got_w = np.fromfile(tmp_path / "weights.bin", np.float32).reshape(shape.tokens, shape.used)
    assert np.allclose(got_w, weights, rtol=1e-5, atol=1e-6), f"seed {seed}"
    out = np.fromfile(tmp_path / "out.bin", np.float32).reshape(shape.tokens, shape.hidden)
    assert np.isfinite(out).all()
    assert rel_err(out, expected) < tol, f"seed {seed}: rel err {rel_err(out, expected):.3g}"
