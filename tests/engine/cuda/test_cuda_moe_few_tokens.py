"""kernels/moe.py's path for 1 to FUSED_DECODE_MAX_TOKENS tokens on the GPU (moe_few_tokens: moe_route, the
gate/up product per pair, moe_down_combine_<fmt>): against the grouped path (fused_decode=False) and the numpy
layer, at a Qwen3.5-35B-A3B-like routing (top 8 of 64 experts) with its Q4_K gate/up and Q6_K, Q4_K or Q8_0
down, with and without Gemma 4's expert scale; its three launches. A decode graph's replay of it with
programmatic launches: test_cuda_moe_decode.py; the host-side choice of the path (everywhere):
test_moe_few_tokens_choice.py."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_samples import GEMV_TOL, random_tensor, rel_err

from app.engine.layers.moe import MoE
from app.engine.models.config import MoeSpec
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES

pytestmark = pytest.mark.gpu
HIDDEN, FF, EXPERTS, USED = 512, 256, 64, 8
P = "blk.0"
SPEC = MoeSpec(EXPERTS, USED, FF)  # softmax then top 8, renormalised; SiLU
SAME_SUMS_TOL = 1e-6  # both paths run the same dots and add the pairs in the same order: equal but for fma choices


def _layer(cpu, rng, down: str, scale: bool):
    """(numpy layer, device experts (gate, up, down), expert_scale on the device or None)."""
    import cupy as cp

    from app.engine.kernels.moe import upload_stacked

    router = rng.standard_normal((EXPERTS, HIDDEN)) / 16
    tensors = {f"{P}.ffn_gate_inp.weight": QuantizedTensor.from_float("router", router.astype(np.float32),
                                                                       QUANT_TYPES["F32"])}  # fmt: skip
    for part, rows, cols, qtype in (("gate", FF, HIDDEN, "Q4_K"), ("up", FF, HIDDEN, "Q4_K"), ("down", HIDDEN, FF, down)):
        flat = random_tensor(qtype, EXPERTS * rows, cols, rng, part)
        tensors[f"{P}.ffn_{part}_exps.weight"] = QuantizedTensor(part, flat.qtype, (EXPERTS, rows, cols), flat.data)
    if scale:
        values = rng.uniform(0.5, 1.5, EXPERTS).astype(np.float32)
        tensors[f"{P}.ffn_down_exps.scale"] = QuantizedTensor.from_float("scale", values, QUANT_TYPES["F32"])
    layer = MoE(cpu, tensors, P, SPEC)
    stacked = [upload_stacked(tensors[f"{P}.ffn_{n}_exps.weight"]) for n in ("gate", "up", "down")]
    return layer, stacked, None if layer.expert_scale is None else cp.asarray(layer.expert_scale, cp.float32)


@pytest.mark.parametrize(("down", "scale"), [("Q6_K", False), ("Q4_K", True), ("Q8_0", False), ("Q6_K", True)])
def test_few_tokens_match_the_grouped_path_and_numpy(cuda, cpu, rng, down, scale):
    """1 to 4 tokens (one random layer for all: its numpy experts take a while to build)."""
    import cupy as cp

    from app.engine.kernels.moe import FUSED_DECODE_MAX_TOKENS, moe_forward

    layer, stacked, expert_scale = _layer(cpu, rng, down, scale)
    for n_tok in range(1, FUSED_DECODE_MAX_TOKENS + 1):
        x = rng.standard_normal((n_tok, HIDDEN)).astype(np.float32)
        logits = layer.router(x)
        args = (cp.asarray(x), cp.asarray(logits), SPEC, *stacked, expert_scale)
        fused = cp.asnumpy(moe_forward(*args, fused_decode=True))
        grouped = cp.asnumpy(moe_forward(*args, fused_decode=False))
        assert np.isfinite(fused).all(), f"{n_tok} tokens"
        assert rel_err(fused, grouped) < SAME_SUMS_TOL, f"{n_tok} tokens: {rel_err(fused, grouped):.3g}"
        assert rel_err(fused, layer(x)) < GEMV_TOL, f"{n_tok} tokens: {rel_err(fused, layer(x)):.3g}"


def test_few_tokens_run_three_launches(cuda, cpu, rng, monkeypatch):
    """moe_route, the per-pair gated product and the fused down product + combine: no grouping, no combine."""
    import cupy as cp

    from app.engine.kernels import moe as kmoe

    layer, stacked, _ = _layer(cpu, rng, "Q6_K", False)
    names: list[str] = []
    real = kmoe._kernel
    monkeypatch.setattr(kmoe, "_kernel", lambda name, *a: names.append(name) or real(name, *a))
    x = rng.standard_normal((2, HIDDEN)).astype(np.float32)
    kmoe.moe_forward(cp.asarray(x), cp.asarray(layer.router(x)), SPEC, *stacked)
    assert names == ["moe_route", "moe_pair_gated_q4_k", "moe_down_combine_q6_k"]
    names.clear()
    kmoe.moe_forward(cp.asarray(x), cp.asarray(layer.router(x)), SPEC, *stacked, fused_decode=False)
    assert names == ["moe_route_grouped", "moe_grouped_gated_q4_k", "moe_grouped_q6_k", "moe_combine"]


def test_shared_expert_joins_the_combine(cuda, cpu, rng):
    """A shared expert's output and gate logit (a column of a wider product, strided) join the few-tokens combine:
    the grouped path's `routed + output * sigmoid(logit)` (two more launches there), 1 to 4 tokens."""
    import cupy as cp

    from app.engine.kernels.moe import FUSED_DECODE_MAX_TOKENS, SharedJoin, moe_forward

    layer, stacked, _ = _layer(cpu, rng, "Q6_K", False)
    for n_tok in range(1, FUSED_DECODE_MAX_TOKENS + 1):
        x = rng.standard_normal((n_tok, HIDDEN)).astype(np.float32)
        args = (cp.asarray(x), cp.asarray(layer.router(x)), SPEC, *stacked)
        routed = cp.asnumpy(moe_forward(*args, fused_decode=False))
        shared = (rng.standard_normal((n_tok, HIDDEN)) * np.abs(routed).max()).astype(np.float32)
        logits = (rng.standard_normal((n_tok, 3)) * 3).astype(np.float32)  # the gate is column 0
        join = SharedJoin(cp.asarray(shared), cp.asarray(logits)[:, :1])
        fused = cp.asnumpy(moe_forward(*args, fused_decode=True, shared=join))
        grouped = cp.asnumpy(moe_forward(*args, fused_decode=False, shared=join))
        want = routed + cpu.output_gate(shared, logits[:, :1], "sigmoid")
        assert rel_err(fused, grouped) < SAME_SUMS_TOL, f"{n_tok} tokens: {rel_err(fused, grouped):.3g}"
        assert rel_err(fused, want) < SAME_SUMS_TOL, f"{n_tok} tokens: {rel_err(fused, want):.3g}"
