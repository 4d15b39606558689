"""moe.cu at the routing of Qwen3.5-35B-A3B (256 experts, top 8; Q4_K gate/up, Q6_K down, as its GGUF) on the
GPU, against the numpy MoE layer: the pair sets of decode and small batches (the products' grids cover only
the experts with pairs, the builds of 1, 2 and 4 pairs a pass), the grouping of many pairs, a decode graph's
replay with programmatic launches (the kernels wait for their predecessors: issue 34), skipped pairs and
gate/up of different formats (two products and moe_gated)."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_samples import experts_tol, random_tensor, rel_err

from app.engine.layers.moe import MoE
from app.engine.models.config import MoeSpec
from app.engine.moe.ops import expert_forward, route, sum_over_experts
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES

pytestmark = pytest.mark.gpu
HIDDEN, FF, EXPERTS, USED = 256, 256, 256, 8
P = "blk.0"
SPEC = MoeSpec(EXPERTS, USED, FF)  # softmax then top 8, renormalised; SiLU


def _tensors(rng, formats: tuple[str, str, str] = ("Q4_K", "Q4_K", "Q6_K")) -> dict[str, QuantizedTensor]:
    router = rng.standard_normal((EXPERTS, HIDDEN)).astype(np.float32) / 16
    tensors = {f"{P}.ffn_gate_inp.weight": QuantizedTensor.from_float("router", router, QUANT_TYPES["F32"])}
    for (part, rows, cols), qtype in zip((("gate", FF, HIDDEN), ("up", FF, HIDDEN), ("down", HIDDEN, FF)), formats,
                                         strict=True):  # fmt: skip
        flat = random_tensor(qtype, EXPERTS * rows, cols, rng, part)
        tensors[f"{P}.ffn_{part}_exps.weight"] = QuantizedTensor(part, flat.qtype, (EXPERTS, rows, cols), flat.data)
    return tensors


def _stacked(tensors: dict) -> list:
    from app.engine.kernels.moe import upload_stacked

    return [upload_stacked(tensors[f"{P}.ffn_{n}_exps.weight"]) for n in ("gate", "up", "down")]


@pytest.fixture(scope="module")
def layer(cpu):
    """One random layer for the module (its numpy weights are 200 MB of float32)."""
    tensors = _tensors(np.random.default_rng(34))
    return MoE(cpu, tensors, P, SPEC), _stacked(tensors)


# 1: decode (8 experts of 256, one pair each); 8, 32: most experts one pair, a few more; 128: ~4 an expert
# (the 2- and 4-pair builds); 2100: 16,800 pairs, past one block's grouping (moe_count + moe_scatter)
@pytest.mark.parametrize("n_tok", [1, 8, 32, 128, 2100])
def test_moe_forward_at_256_experts_matches_numpy(cuda, rng, layer, n_tok):
    import cupy as cp

    from app.engine.kernels.moe import moe_forward

    numpy_layer, stacked = layer
    x = rng.standard_normal((n_tok, HIDDEN)).astype(np.float32)
    logits = numpy_layer.router(x)
    got = cp.asnumpy(moe_forward(cp.asarray(x), cp.asarray(logits), SPEC, *stacked))
    # from ~4 pairs an expert (128 tokens here) the products run on the tensor cores (float16 x and W)
    assert rel_err(got, numpy_layer(x)) < experts_tol(n_tok, USED, EXPERTS, "Q4_K", HIDDEN)


@pytest.mark.parametrize(("n_tok", "fused_decode"), [(1, True), (4, True), (1, False), (32, True)])
def test_moe_forward_replays_in_a_graph_with_programmatic_launches(cuda, rng, layer, n_tok, fused_decode):
    """A decode graph's capture: the replay on new inputs equals the eager call on them, bit for bit (up to
    4 tokens on moe_few_tokens, or with `fused_decode` off on the grouped path)."""
    import cupy as cp

    from app.engine.kernels.moe import moe_forward
    from app.engine.kernels.runtime import pdl

    _, stacked = layer
    x = cp.asarray(rng.standard_normal((n_tok, HIDDEN)).astype(np.float32))
    logits = cp.asarray(rng.standard_normal((n_tok, EXPERTS)).astype(np.float32))
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream, pdl.programmatic_launches():
        moe_forward(x, logits, SPEC, *stacked, fused_decode=fused_decode)  # warm-up: compiles, sizes the pool
        stream.synchronize()
        stream.begin_capture()
        out = moe_forward(x, logits, SPEC, *stacked, fused_decode=fused_decode)
        graph = stream.end_capture()
    first = cp.asnumpy(logits)
    x[...] = cp.asarray(rng.standard_normal((n_tok, HIDDEN)).astype(np.float32))
    logits[...] = cp.asarray(rng.standard_normal((n_tok, EXPERTS)).astype(np.float32))
    cp.cuda.Device().synchronize()
    graph.launch(stream=stream)
    stream.synchronize()
    eager = cp.asnumpy(moe_forward(x, logits, SPEC, *stacked, fused_decode=fused_decode))
    np.testing.assert_array_equal(cp.asnumpy(out), eager)
    assert not (route(np, first, SPEC)[1] == route(np, cp.asnumpy(logits), SPEC)[1]).all()  # other experts


@pytest.mark.parametrize("n_tok", [1, 32])
def test_skipped_pairs_sum_the_kept_ones(cuda, rng, layer, n_tok):
    """moe_experts with `groups` (expert streaming's pass): pairs of the experts not in slots add nothing."""
    import cupy as cp

    from app.engine.kernels.moe import moe_experts, moe_route

    numpy_layer, stacked = layer
    x = rng.standard_normal((n_tok, HIDDEN)).astype(np.float32)
    logits = numpy_layer.router(x)
    chosen, weights = moe_route(cp.asarray(logits), SPEC)
    host_chosen = cp.asnumpy(chosen)
    kept = np.zeros(EXPERTS, bool)
    kept[host_chosen.reshape(-1)[::2]] = True  # about half the pairs' experts
    groups = cp.asarray(np.where(kept[host_chosen], host_chosen, EXPERTS).astype(np.int32))
    got = cp.asnumpy(moe_experts(cp.asarray(x), chosen, weights, SPEC, *stacked, groups))

    def run(expert: int, rows: np.ndarray) -> np.ndarray:
        down = numpy_layer.down[expert]
        return expert_forward(numpy_layer.backend, SPEC, numpy_layer.gate_up[expert], down.weight, down.bias, rows)

    w, want = route(np, logits, SPEC)
    assert (host_chosen == want).all()
    expected = sum_over_experts(numpy_layer.backend, x, np.where(kept[want], w, 0.0), want, SPEC, run)
    assert rel_err(got, expected) < 2e-5


def test_gate_and_up_of_different_formats(cuda, cpu, rng):
    import cupy as cp

    from app.engine.kernels.moe import moe_forward

    tensors = _tensors(rng, ("Q4_K", "Q5_K", "Q6_K"))
    numpy_layer = MoE(cpu, tensors, P, SPEC)
    x = rng.standard_normal((3, HIDDEN)).astype(np.float32)
    logits = numpy_layer.router(x)
    got = cp.asnumpy(moe_forward(cp.asarray(x), cp.asarray(logits), SPEC, *_stacked(tensors)))
    assert rel_err(got, numpy_layer(x)) < 2e-5


@pytest.mark.parametrize(("n_tok", "skipping"), [(1, False), (32, True), (2100, False), (2100, True)])
def test_group_pairs_lists_the_experts_with_pairs(cuda, rng, n_tok, skipping):
    """The grouping's invariants, one block (up to ONE_BLOCK_PLAN_PAIRS pairs) and many: offsets are the
    exclusive sums of the counts, `active` the slots with pairs in ascending order (never the skipped group),
    `order` groups the pairs and `where` is its inverse."""
    import cupy as cp

    from app.engine.kernels.moe import group_pairs

    slots = EXPERTS - 56 if skipping else EXPERTS  # skipping: some experts have no slot (group `slots`)
    groups = np.stack([rng.choice(EXPERTS, USED, replace=False) for _ in range(n_tok)]).astype(np.int32)
    groups = np.minimum(groups, slots)
    plan = group_pairs(cp.asarray(groups), slots, USED, skipping)
    flat = groups.reshape(-1)
    counts = np.bincount(flat, minlength=slots + 1)[: slots + skipping]
    offsets, active = cp.asnumpy(plan.offsets), cp.asnumpy(plan.active)
    order, where = cp.asnumpy(plan.order), cp.asnumpy(plan.where)
    np.testing.assert_array_equal(offsets, np.concatenate([[0], np.cumsum(counts)]))
    busy = np.nonzero(counts[:slots])[0]
    assert active[0] == len(busy)
    np.testing.assert_array_equal(active[1 : 1 + len(busy)], busy)
    np.testing.assert_array_equal(np.sort(order), np.arange(flat.size))
    np.testing.assert_array_equal(order[where], np.arange(flat.size))
    for g in range(len(counts)):
        assert (flat[order[offsets[g] : offsets[g + 1]]] == g).all()
