"""moe.cu's pipeline (route, group by expert, grouped products, gated unit, combine) on the SIMT
emulator, against the numpy MoE layer (layers/moe.py) on the same checkpoint tensors.

Not marked `gpu`: the emulator runs the kernels as host threads. Stacked expert weights come in
the formats the kernels decode straight from their blocks (quant.cuh); both routings and the three
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
from app.engine.kernels.moe import ACTIVATION_KINDS
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


@pytest.mark.parametrize(("qtype", "activation"), [("Q8_0", "silu"), ("F16", "swiglu_oai"), ("BF16", "silu"),
                                                   ("Q4_0", "swiglu_oai"), ("Q8_0", "gelu_tanh")])  # fmt: skip
def test_moe_pipeline_emulated(moe_emu, tmp_path, request, qtype, activation):
    rng, seed = fresh_rng(request.node.nodeid)
    gpt_oss = activation == "swiglu_oai"
    spec = MoeSpec(EXPERTS, USED, FF, routing="topk_softmax" if gpt_oss else "softmax_topk", normalize=not gpt_oss,
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
    backend = CpuBackend()
    layer = MoE(backend, tensors, p, spec)
    x = rng.standard_normal((TOKENS, HIDDEN)).astype(np.float32)
    logits = layer.router(x)
    expected = layer(x)

    (tmp_path / "x.bin").write_bytes(x.tobytes())
    (tmp_path / "logits.bin").write_bytes(logits.astype(np.float32).tobytes())
    for part in ("gate", "up", "down"):
        (tmp_path / f"{part}.bin").write_bytes(tensors[f"{p}.ffn_{part}_exps.weight"].data.tobytes())
        bias = tensors.get(f"{p}.ffn_{part}_exps.bias")
        if bias is not None:
            (tmp_path / f"{part}_bias.bin").write_bytes(bias.dequantize().tobytes())
    row_gu = tensors[f"{p}.ffn_gate_exps.weight"].data.shape[1]
    row_d = tensors[f"{p}.ffn_down_exps.weight"].data.shape[1]
    _run(moe_emu, "moe", qtype.lower(), tmp_path, TOKENS, HIDDEN, FF, EXPERTS, USED, int(gpt_oss), int(not gpt_oss),
         ACTIVATION_KINDS[activation], row_gu, row_d)  # fmt: skip

    chosen = np.fromfile(tmp_path / "chosen.bin", np.int32).reshape(TOKENS, USED)
    weights, want = route(np, logits, spec)
    assert (chosen == want).all(), f"seed {seed}: experts {chosen.tolist()} != {want.tolist()}"
    got_w = np.fromfile(tmp_path / "weights.bin", np.float32).reshape(TOKENS, USED)
    assert np.allclose(got_w, weights, rtol=1e-5, atol=1e-6), f"seed {seed}"
    out = np.fromfile(tmp_path / "out.bin", np.float32).reshape(TOKENS, HIDDEN)
    assert np.isfinite(out).all()
    assert rel_err(out, expected) < 1e-5, f"seed {seed}: rel err {rel_err(out, expected):.3g}"
