"""moe.cu through its wrapper on the GPU against the numpy MoE layer (layers/moe.py): decode
(one token, k experts) and a prefill-sized batch, every routing and activation, with biases, Gemma 4's
per-expert scales and Laguna's score bias and router softcap."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_samples import experts_tol, random_tensor, rel_err

from app.engine.layers.moe import MoE
from app.engine.models.config import MoeSpec
from app.engine.moe.ops import route
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES

pytestmark = pytest.mark.gpu
HIDDEN, FF, EXPERTS, USED = 256, 512, 16, 4


def _stacked(qtype: str, rows: int, cols: int, rng, name: str) -> QuantizedTensor:
    flat = random_tensor(qtype, EXPERTS * rows, cols, rng, name)
    return QuantizedTensor(name, flat.qtype, (EXPERTS, rows, cols), flat.data)


def _f32(name: str, values: np.ndarray) -> QuantizedTensor:
    return QuantizedTensor.from_float(name, values.astype(np.float32), QUANT_TYPES["F32"])


@pytest.mark.parametrize(("n_tok", "int_x"), [(1, False), (3, False), (77, False), (9, True), (12, False), (12, True)])
@pytest.mark.parametrize(("qtype", "gpt_oss"), [
    ("Q4_K", False), ("Q8_0", True), ("BF16", True), ("Q6_K", False), ("MXFP4", True),  # MXFP4: GPT-OSS's experts
])  # fmt: skip
def test_moe_forward_matches_numpy(cuda, cpu, rng, qtype, gpt_oss, n_tok, int_x):
    """9 and 12 tokens: the grouped products (4 pairs an expert start the tensor cores), over float32 x or, with
    `int_x`, int16 x (a format with integer codes; BF16 stays on float32 x)."""
    import cupy as cp

    from app.engine.kernels.moe import moe_forward, upload_stacked

    spec = MoeSpec(EXPERTS, USED, FF, routing="topk_softmax" if gpt_oss else "softmax_topk", normalize=not gpt_oss,
                   activation="swiglu_oai" if gpt_oss else "silu")  # fmt: skip
    p = "blk.0"
    tensors = {f"{p}.ffn_gate_inp.weight": _f32("router", rng.standard_normal((EXPERTS, HIDDEN)) / 16)}
    for part, rows, cols in (("gate", FF, HIDDEN), ("up", FF, HIDDEN), ("down", HIDDEN, FF)):
        tensors[f"{p}.ffn_{part}_exps.weight"] = _stacked(qtype, rows, cols, rng, part)
        if gpt_oss:
            tensors[f"{p}.ffn_{part}_exps.bias"] = _f32(part, rng.standard_normal((EXPERTS, rows)) * 0.1)
    layer = MoE(cpu, tensors, p, spec)
    x = rng.standard_normal((n_tok, HIDDEN)).astype(np.float32)
    logits = layer.router(x)
    expected = layer(x)
    stacked = [upload_stacked(tensors[f"{p}.ffn_{n}_exps.weight"], tensors.get(f"{p}.ffn_{n}_exps.bias"))
               for n in ("gate", "up", "down")]  # fmt: skip
    got = cp.asnumpy(moe_forward(cp.asarray(x), cp.asarray(logits), spec, *stacked, int_x=int_x))
    _, chosen = route(np, logits, spec)
    assert chosen.shape == (n_tok, USED)
    assert rel_err(got, expected) < experts_tol(n_tok, USED, EXPERTS, qtype, HIDDEN, int_x)  # 77: moe_mma


FAMILY_ROUTERS = {
    # Gemma 4: GELU experts, softmax then top k renormalised, a learned factor per expert's output
    "gemma4": (MoeSpec(EXPERTS, USED, FF, activation="gelu_tanh"), "ffn_down_exps.scale"),
    # Laguna: sigmoid scores chosen with a bias, weighed sum-normalised times a scale, on capped logits
    "laguna": (MoeSpec(EXPERTS, USED, FF, routing="sigmoid_grouped", routed_scale=2.5, router_softcap=0.5),
               "exp_probs_b.bias"),
    # the one router kernel with every sigmoid option at once: Nemotron-H's groups (the best 2 of 4 compete),
    # the score bias, a router softcap and a routed scale
    "grouped": (MoeSpec(EXPERTS, USED, FF, routing="sigmoid_grouped", num_groups=4, topk_groups=2, routed_scale=2.5,
                        router_softcap=0.5), "exp_probs_b.bias"),
}  # fmt: skip


@pytest.mark.parametrize("n_tok", [1, 77])
@pytest.mark.parametrize("family", sorted(FAMILY_ROUTERS))
def test_moe_forward_with_family_routing_matches_numpy(cuda, cpu, rng, family: str, n_tok: int) -> None:
    """moe_forward's expert_scale (Gemma 4) and score_bias with sigmoid routing and a router softcap (Laguna;
    with expert groups too), against the numpy layer, handed the same router logits."""
    import cupy as cp

    from app.engine.kernels.moe import moe_forward, upload_stacked

    spec, extra = FAMILY_ROUTERS[family]
    p = "blk.0"
    tensors = {f"{p}.ffn_gate_inp.weight": _f32("router", rng.standard_normal((EXPERTS, HIDDEN)) / 16),
               f"{p}.{extra}": _f32(extra, rng.uniform(0.5, 1.5, EXPERTS))}  # fmt: skip
    for part, rows, cols in (("gate", FF, HIDDEN), ("up", FF, HIDDEN), ("down", HIDDEN, FF)):
        tensors[f"{p}.ffn_{part}_exps.weight"] = _stacked("Q8_0", rows, cols, rng, part)
    layer = MoE(cpu, tensors, p, spec)
    x = rng.standard_normal((n_tok, HIDDEN)).astype(np.float32)
    logits = layer.router(x)
    expected = layer(x)
    stacked = [upload_stacked(tensors[f"{p}.ffn_{n}_exps.weight"]) for n in ("gate", "up", "down")]
    values = cp.asarray(tensors[f"{p}.{extra}"].dequantize().reshape(-1))
    extras = {"expert_scale": values} if family == "gemma4" else {"score_bias": values}
    got = cp.asnumpy(moe_forward(cp.asarray(x), cp.asarray(logits), spec, *stacked, **extras))
    assert rel_err(got, expected) < experts_tol(n_tok, USED, EXPERTS, "Q8_0", HIDDEN)
