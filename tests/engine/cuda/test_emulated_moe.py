"""moe.cu's pipeline (route, group by expert, grouped products, gated unit, combine) on the SIMT
emulator, against the numpy MoE layer (layers/moe.py) on the same checkpoint tensors.

Not marked `gpu`: the emulator runs the kernels as host threads. Stacked expert weights come in
the formats the kernels decode straight from their blocks (quant.cuh); the three routings (softmax then
top k, GPT-OSS's top k then softmax, Laguna's biased sigmoid scores on capped logits) and the three
activations (SiLU, GPT-OSS's clamped SwiGLU with its biases, Gemma 4's GELU-tanh) are covered.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cuda_samples import fresh_rng, random_tensor, rel_err
from emulator import build as _build
from emulator import run as _run

from app.engine.backend.cpu import CpuBackend
from app.engine.kernels.moe import ACTIVATION_KINDS, ROUTING_MODES
from app.engine.layers.moe import MoE
from app.engine.models.config import MoeSpec
from app.engine.moe.ops import route
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES

pytestmark = pytest.mark.slow  # ~40 s together: kernels run thread by thread on the CPU
HIDDEN, FF, EXPERTS, USED, TOKENS = 64, 32, 6, 2, 7


@pytest.fixture(scope="module")
def moe_emu(tmp_path_factory) -> Path:
    return _build(tmp_path_factory, "moe_main.cpp")


def _stacked(qtype: str, rows: int, cols: int, rng, name: str) -> QuantizedTensor:
    flat = random_tensor(qtype, EXPERTS * rows, cols, rng, name)
    return QuantizedTensor(name, flat.qtype, (EXPERTS, rows, cols), flat.data)


def _f32(name: str, values: np.ndarray) -> QuantizedTensor:
    return QuantizedTensor.from_float(name, values.astype(np.float32), QUANT_TYPES["F32"])


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
    spec = MoeSpec(EXPERTS, USED, FF, **({"routing": "topk_softmax", "normalize": False} if gpt_oss else routing),
                   activation=activation)  # fmt: skip
    p = "blk.0"
    tensors = {
        f"{p}.ffn_gate_inp.weight": _f32("router", rng.standard_normal((EXPERTS, HIDDEN)) / 8),
        f"{p}.ffn_gate_exps.weight": _stacked(qtype, FF, HIDDEN, rng, "gate"),
        f"{p}.ffn_up_exps.weight": _stacked(qtype, FF, HIDDEN, rng, "up"),
        f"{p}.ffn_down_exps.weight": _stacked(qtype, HIDDEN, FF, rng, "down"),
    }
    if gpt_oss:
        for part, rows in (("gate", FF), ("up", FF), ("down", HIDDEN)):
            tensors[f"{p}.ffn_{part}_exps.bias"] = _f32(part, rng.standard_normal((EXPERTS, rows)) * 0.1)
    if spec.routing == "sigmoid_grouped":
        tensors[f"{p}.exp_probs_b.bias"] = _f32("score_bias", rng.standard_normal(EXPERTS) * 0.1)
    backend = CpuBackend()
    layer = MoE(backend, tensors, p, spec)
    x = rng.standard_normal((TOKENS, HIDDEN)).astype(np.float32)
    logits = layer.router(x)
    expected = layer(x)

    (tmp_path / "x.bin").write_bytes(x.tobytes())
    (tmp_path / "logits.bin").write_bytes(logits.astype(np.float32).tobytes())
    if layer.score_bias is not None:
        (tmp_path / "score_bias.bin").write_bytes(layer.score_bias.astype(np.float32).tobytes())
    for part in ("gate", "up", "down"):
        (tmp_path / f"{part}.bin").write_bytes(tensors[f"{p}.ffn_{part}_exps.weight"].data.tobytes())
        bias = tensors.get(f"{p}.ffn_{part}_exps.bias")
        if bias is not None:
            (tmp_path / f"{part}_bias.bin").write_bytes(bias.dequantize().tobytes())
    row_gu = tensors[f"{p}.ffn_gate_exps.weight"].data.shape[1]
    row_d = tensors[f"{p}.ffn_down_exps.weight"].data.shape[1]
    _run(moe_emu, "moe", qtype.lower(), tmp_path, TOKENS, HIDDEN, FF, EXPERTS, USED, ROUTING_MODES[spec.routing],
         int(spec.normalize), ACTIVATION_KINDS[activation], row_gu, row_d, spec.router_softcap,
         spec.routed_scale, spec.num_groups, spec.topk_groups)  # fmt: skip

    _check_outputs(tmp_path, layer, logits, spec, expected, seed)


@pytest.mark.parametrize(("qtype", "groups", "topk_groups", "bias", "normalize", "scale", "softcap"), [
    ("Q8_0", 1, 1, True, True, 2.5, 0.0),  # Nemotron-H: one group, the choice bias, renormalised and scaled
    ("BF16", 3, 2, True, False, 1.0, 0.0),  # group-limited: only the two best of three groups compete
    ("F16", 2, 1, False, True, 1.5, 0.0),
    ("Q8_0", 3, 2, True, True, 2.0, 0.5),  # every sigmoid option at once: groups, bias, softcap, scale
])  # fmt: skip
def test_sigmoid_routed_ungated_experts_emulated(moe_emu, tmp_path, request, qtype, groups, topk_groups, bias,
                                                 normalize, scale, softcap):  # fmt: skip
    """Nemotron-H's experts: moe_route's sigmoid mode (sigmoid scores, the choice on scores + bias within the
    best groups; the one router kernel Laguna's one-group routing takes too) and squared-ReLU experts with no
    gate product, against the numpy layer."""
    rng, seed = fresh_rng(request.node.nodeid)
    spec = MoeSpec(EXPERTS, USED, FF, routing="sigmoid_grouped", normalize=normalize, num_groups=groups,
                   topk_groups=topk_groups, routed_scale=scale, router_softcap=softcap,
                   activation="relu2")  # fmt: skip
    p = "blk.0"
    tensors = {
        f"{p}.ffn_gate_inp.weight": _f32("router", rng.standard_normal((EXPERTS, HIDDEN)) / 4),
        f"{p}.ffn_up_exps.weight": _stacked(qtype, FF, HIDDEN, rng, "up"),
        f"{p}.ffn_down_exps.weight": _stacked(qtype, HIDDEN, FF, rng, "down"),
    }
    if bias:
        tensors[f"{p}.exp_probs_b.bias"] = _f32("bias", rng.standard_normal(EXPERTS) * 0.3)
    layer = MoE(CpuBackend(), tensors, p, spec)
    x = rng.standard_normal((TOKENS, HIDDEN)).astype(np.float32)
    logits = layer.router(x)
    expected = layer(x)
    (tmp_path / "x.bin").write_bytes(x.tobytes())
    (tmp_path / "logits.bin").write_bytes(logits.astype(np.float32).tobytes())
    for part in ("up", "down"):
        (tmp_path / f"{part}.bin").write_bytes(tensors[f"{p}.ffn_{part}_exps.weight"].data.tobytes())
    if bias:
        (tmp_path / "score_bias.bin").write_bytes(layer.score_bias.astype(np.float32).tobytes())
    row_gu = tensors[f"{p}.ffn_up_exps.weight"].data.shape[1]
    row_d = tensors[f"{p}.ffn_down_exps.weight"].data.shape[1]
    _run(moe_emu, "moe", qtype.lower(), tmp_path, TOKENS, HIDDEN, FF, EXPERTS, USED, ROUTING_MODES[spec.routing],
         int(normalize), ACTIVATION_KINDS["relu2"], row_gu, row_d, softcap, scale, groups, topk_groups)  # fmt: skip

    _check_outputs(tmp_path, layer, logits, spec, expected, seed)


def _check_outputs(tmp_path: Path, layer: MoE, logits: np.ndarray, spec: MoeSpec, expected: np.ndarray, seed: int):
    """The emulated route's experts and weights equal the numpy router's, and the output the layer's."""
    chosen = np.fromfile(tmp_path / "chosen.bin", np.int32).reshape(TOKENS, USED)
    weights, want = route(np, logits, spec, layer.score_bias)
    assert (chosen == want).all(), f"seed {seed}: experts {chosen.tolist()} != {want.tolist()}"
    got_w = np.fromfile(tmp_path / "weights.bin", np.float32).reshape(TOKENS, USED)
    assert np.allclose(got_w, weights, rtol=1e-5, atol=1e-6), f"seed {seed}"
    out = np.fromfile(tmp_path / "out.bin", np.float32).reshape(TOKENS, HIDDEN)
    assert np.isfinite(out).all()
    assert rel_err(out, expected) < 1e-5, f"seed {seed}: rel err {rel_err(out, expected):.3g}"
