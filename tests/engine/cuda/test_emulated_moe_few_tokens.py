"""kernels/moe.py's path for a few tokens (moe_few_tokens: moe_route, the gate/up product per (token, slot) pair,
the down product and the combine in one launch, moe_down_combine_<fmt>) on the SIMT emulator, against the numpy
MoE layer (layers/moe.py) and against the grouped path (moe_route_grouped, the grouped products, moe_combine) on
the same inputs.

The two paths run the same dot products over the same lanes and add a token's pairs in the same (expert-id)
order, so their outputs are equal to the bit, not just close. Cases: 1, 2 and 4 tokens, top 8 of 32 experts,
Q4_K gate/up beside Q4_K, Q6_K, Q8_0 and Q5_0 down, with and without Gemma 4's expert_scale; GPT-OSS's biases and
routing, Nemotron-H's ungated relu2 experts with grouped sigmoid routing, k = 16 (blocks of 16 warps) and a
hidden size whose last row tile is partial. Not marked `gpu`: the kernels run as host threads.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from cuda_samples import fresh_rng, random_tensor, rel_err
from emulator import build as _build
from emulator import run as _run
from moe_files import write_moe_inputs

from app.engine.backend.cpu import CpuBackend
from app.engine.kernels.moe import ACTIVATION_KINDS, FUSED_DECODE_MAX_TOKENS, ROUTING_MODES
from app.engine.layers.moe import MoE
from app.engine.models.config import MoeSpec
from app.engine.moe.ops import route
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES

pytestmark = pytest.mark.slow  # the kernels run thread by thread on the CPU
P = "blk.0"
GROUPED, FEW_TOKENS = (0, 0, 1, 0), (0, 0, 0, 1)  # the harness's MANY_PAIRS SEPARATE FUSED_ROUTE FUSED_DECODE


class Case(NamedTuple):
    tokens: int
    gate_up: str  # format of gate and up
    down: str
    activation: str = "silu"
    scale: bool = False  # Gemma 4's ffn_down_exps.scale
    experts: int = 32
    used: int = 8
    hidden: int = 256
    ff: int = 256
    routing: str = "softmax_topk"


CASES = [
    Case(1, "Q4_K", "Q6_K"),  # Qwen3.5-35B-A3B's formats at c=1
    Case(2, "Q4_K", "Q4_K", scale=True),
    Case(4, "Q4_K", "Q6_K", scale=True),
    Case(1, "Q8_0", "Q8_0", "gelu_tanh", scale=True),  # Gemma 4's activation and scale
    Case(4, "Q8_0", "Q8_0"),
    Case(2, "Q4_K", "Q8_0"),
    Case(3, "Q8_0", "Q8_0", "swiglu_oai", routing="topk_softmax"),  # GPT-OSS: biases on gate, up and down
    Case(2, "Q8_0", "Q8_0", "relu2", routing="sigmoid_grouped"),  # Nemotron-H: ungated, grouped sigmoid routing
    Case(4, "Q8_0", "Q8_0", used=16),  # MOE_MAX_K: a block of 16 warps
    Case(2, "Q8_0", "Q8_0", hidden=96, ff=1024),  # 3 units a row (64-row tiles, the second partial); down 32 wide
    # Gemma 4's layer 1 of Q4_K_M: a Q5_0 down of 96 columns (66-byte rows, not 16-byte aligned), its scale
    Case(4, "Q4_K", "Q5_0", "gelu_tanh", scale=True, ff=96),
]


def _id(case: Case) -> str:
    extras = [case.activation, *(["scale"] if case.scale else []), f"top{case.used}", f"h{case.hidden}"]
    return f"{case.tokens}t-{case.gate_up}-{case.down}-" + "-".join(extras)


@pytest.fixture(scope="module")
def moe_emu(tmp_path_factory) -> Path:
    return _build(tmp_path_factory, "moe_main.cpp")


def _spec(case: Case) -> MoeSpec:
    if case.routing == "topk_softmax":
        return MoeSpec(case.experts, case.used, case.ff, routing="topk_softmax", normalize=False,
                       activation=case.activation)  # fmt: skip
    if case.routing == "sigmoid_grouped":
        return MoeSpec(case.experts, case.used, case.ff, routing="sigmoid_grouped", num_groups=4, topk_groups=2,
                       routed_scale=2.0, activation=case.activation)  # fmt: skip
    return MoeSpec(case.experts, case.used, case.ff, activation=case.activation)


def _f32(name: str, values: np.ndarray) -> QuantizedTensor:
    return QuantizedTensor.from_float(name, values.astype(np.float32), QUANT_TYPES["F32"])


def _tensors(case: Case, spec: MoeSpec, rng) -> dict[str, QuantizedTensor]:
    h, ff, e = case.hidden, case.ff, case.experts
    tensors = {f"{P}.ffn_gate_inp.weight": _f32("router", rng.standard_normal((e, h)) / 8)}
    parts = [("up", ff, h, case.gate_up), ("down", h, ff, case.down)]
    if spec.activation != "relu2":
        parts.insert(0, ("gate", ff, h, case.gate_up))
    for part, rows, cols, qtype in parts:
        flat = random_tensor(qtype, e * rows, cols, rng, part)
        tensors[f"{P}.ffn_{part}_exps.weight"] = QuantizedTensor(part, flat.qtype, (e, rows, cols), flat.data)
    if spec.activation == "swiglu_oai":
        for part, rows in (("gate", ff), ("up", ff), ("down", h)):
            tensors[f"{P}.ffn_{part}_exps.bias"] = _f32(part, rng.standard_normal((e, rows)) * 0.1)
    if spec.routing == "sigmoid_grouped":
        tensors[f"{P}.exp_probs_b.bias"] = _f32("score_bias", rng.standard_normal(e) * 0.3)
    if case.scale:
        tensors[f"{P}.ffn_down_exps.scale"] = _f32("scale", rng.uniform(0.5, 1.5, e))
    return tensors


def _run_path(exe: Path, folder: Path, case: Case, spec: MoeSpec, tensors: dict, variant: tuple[int, ...]):
    """The harness's pipeline on the inputs in `folder`: (out [T, hidden], chosen, weights)."""
    row_gu = tensors[f"{P}.ffn_up_exps.weight"].data.shape[1]
    row_d = tensors[f"{P}.ffn_down_exps.weight"].data.shape[1]
    _run(exe, "moe", f"{case.gate_up.lower()},{case.down.lower()}", folder, case.tokens, case.hidden, case.ff,
         case.experts, case.used, ROUTING_MODES[spec.routing], int(spec.normalize), ACTIVATION_KINDS[spec.activation],
         row_gu, row_d, spec.router_softcap, spec.routed_scale, spec.num_groups, spec.topk_groups,
         *variant)  # fmt: skip
    out = np.fromfile(folder / "out.bin", np.float32).reshape(case.tokens, case.hidden)
    chosen = np.fromfile(folder / "chosen.bin", np.int32).reshape(case.tokens, case.used)
    weights = np.fromfile(folder / "weights.bin", np.float32).reshape(case.tokens, case.used)
    return out, chosen, weights


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_few_tokens_path_matches_numpy_and_the_grouped_path_emulated(moe_emu, tmp_path, request, case: Case):
    assert case.tokens <= FUSED_DECODE_MAX_TOKENS  # the token counts moe_forward sends down this path
    rng, seed = fresh_rng(request.node.nodeid)
    spec = _spec(case)
    tensors = _tensors(case, spec, rng)
    layer = MoE(CpuBackend(), tensors, P, spec)
    assert (layer.expert_scale is not None) == case.scale
    x = rng.standard_normal((case.tokens, case.hidden)).astype(np.float32)
    logits = layer.router(x)
    expected = layer(x)
    write_moe_inputs(tmp_path, tensors, P, x, logits, layer.score_bias)

    out, chosen, weights = _run_path(moe_emu, tmp_path, case, spec, tensors, FEW_TOKENS)
    want_w, want_chosen = route(np, logits, spec, layer.score_bias)
    assert (chosen == want_chosen).all(), f"seed {seed}: experts {chosen.tolist()} != {want_chosen.tolist()}"
    assert np.allclose(weights, want_w, rtol=1e-5, atol=1e-6), f"seed {seed}"
    assert np.isfinite(out).all(), f"seed {seed}: every output row is written"
    assert rel_err(out, expected) < 1e-5, f"seed {seed}: rel err {rel_err(out, expected):.3g}"

    grouped, grouped_chosen, _ = _run_path(moe_emu, tmp_path, case, spec, tensors, GROUPED)
    assert (grouped_chosen == chosen).all()
    assert np.array_equal(out, grouped), f"seed {seed}: max diff {np.abs(out - grouped).max():.3g}"


def _written_layer(case: Case, rng, folder: Path) -> tuple[MoeSpec, dict, np.ndarray]:
    """A random layer of `case` and tokens for it, its inputs written to `folder` for the harness: (spec, tensors, x)."""
    spec = _spec(case)
    tensors = _tensors(case, spec, rng)
    layer = MoE(CpuBackend(), tensors, P, spec)
    x = rng.standard_normal((case.tokens, case.hidden)).astype(np.float32)
    write_moe_inputs(folder, tensors, P, x, layer.router(x), layer.score_bias)
    return spec, tensors, x


def test_expert_scale_changes_the_few_tokens_output_emulated(moe_emu, tmp_path, request):
    """The scale reaches moe_down_combine: the same layer without its scale file gives the unscaled sum."""
    rng, seed = fresh_rng(request.node.nodeid)
    case = Case(2, "Q8_0", "Q8_0", scale=True)
    spec, tensors, x = _written_layer(case, rng, tmp_path)
    scaled, _, _ = _run_path(moe_emu, tmp_path, case, spec, tensors, FEW_TOKENS)
    (tmp_path / "expert_scale.bin").unlink()
    unscaled, _, _ = _run_path(moe_emu, tmp_path, case, spec, tensors, FEW_TOKENS)
    del tensors[f"{P}.ffn_down_exps.scale"]
    expected = MoE(CpuBackend(), tensors, P, spec)(x)
    assert rel_err(unscaled, expected) < 1e-5, f"seed {seed}"
    assert rel_err(scaled, unscaled) > 1e-2, f"seed {seed}: the scale made no difference"


@pytest.mark.parametrize("tokens", [1, 4])
def test_shared_expert_joins_the_few_tokens_combine_emulated(moe_emu, tmp_path, request, tokens: int):
    """A shared expert's output joins moe_down_combine's sum times sigmoid(its gate logit), Qwen3.5-MoE's
    `routed + shared * sigmoid(logit)` as the numpy backend computes it; without the files, the routed sum alone."""
    rng, seed = fresh_rng(request.node.nodeid)
    case = Case(tokens, "Q4_K", "Q6_K")
    spec, tensors, _ = _written_layer(case, rng, tmp_path)
    routed, _, _ = _run_path(moe_emu, tmp_path, case, spec, tensors, FEW_TOKENS)
    shared = (rng.standard_normal((case.tokens, case.hidden)) * np.abs(routed).max()).astype(np.float32)
    logit = rng.standard_normal((case.tokens, 1)).astype(np.float32) * 3
    shared.tofile(tmp_path / "shared.bin")
    logit.tofile(tmp_path / "shared_logit.bin")
    joined, _, _ = _run_path(moe_emu, tmp_path, case, spec, tensors, FEW_TOKENS)
    expected = routed + CpuBackend().output_gate(shared, logit, "sigmoid")
    assert rel_err(joined, expected) < 1e-6, f"seed {seed}: rel err {rel_err(joined, expected):.3g}"
    assert rel_err(joined, routed) > 1e-2, f"seed {seed}: the shared expert made no difference"


@pytest.fixture(scope="module")
def moe_emu_rows4(tmp_path_factory) -> Path:
    """The A/B build whose lane groups read four rows of each weight at once (MOE_R=4; the grids stay sized for 2)."""
    return _build(tmp_path_factory, "moe_main.cpp", ("-DMOE_R=4",))


@pytest.mark.parametrize("case", [CASES[0], CASES[-1], CASES[-2]], ids=_id)
def test_four_rows_a_lane_group_give_the_same_bits_emulated(moe_emu, moe_emu_rows4, tmp_path, request, case: Case):
    """MOE_R=4 changes which lane group reads a row, not how a row's dot is summed: both paths' outputs are
    the default build's to the bit (and so the numpy layer's within the test above's bound)."""
    rng, seed = fresh_rng(request.node.nodeid)
    spec, tensors, _ = _written_layer(case, rng, tmp_path)
    for variant in (FEW_TOKENS, GROUPED):
        want, _, _ = _run_path(moe_emu, tmp_path, case, spec, tensors, variant)
        got, _, _ = _run_path(moe_emu_rows4, tmp_path, case, spec, tensors, variant)
        assert np.array_equal(got, want), f"seed {seed}: max diff {np.abs(got - want).max():.3g}"
