"""moe.cu's router (moe_route: a warp per token, the k picks by warp-wide argmax passes) on the SIMT emulator,
against moe/ops.py's `route` (the oracle), at the expert counts of the large MoE families: 256 (Qwen3.5-MoE,
DeepSeek-V3-style groups), 512 (Qwen3-Next) and the 1024 the kernel takes, with every routing mode and option.

Ties are made on purpose (logits on a coarse grid, so many experts share a value): the lower id must win, as
the oracle's stable sort decides, in the expert picks and in the choice of groups. Token counts leave a
block's last warps without a token. Not marked `gpu`: this runs in CI.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cuda_samples import fresh_rng
from emulator import build as _build
from emulator import run as _run

from app.engine.kernels.moe import MAX_EXPERTS, ROUTING_MODES, routing_unsupported
from app.engine.models.config import MoeSpec
from app.engine.moe.ops import route

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def moe_emu(tmp_path_factory) -> Path:
    return _build(tmp_path_factory, "moe_main.cpp")


def _route(exe: Path, tmp_path: Path, logits: np.ndarray, spec: MoeSpec, bias: np.ndarray | None):
    """The emulated moe_route's (chosen, weights)."""
    (tmp_path / "logits.bin").write_bytes(logits.astype(np.float32).tobytes())
    if bias is not None:
        (tmp_path / "score_bias.bin").write_bytes(bias.astype(np.float32).tobytes())
    tokens, k = logits.shape[0], spec.num_used
    _run(exe, "route", tmp_path, tokens, spec.num_experts, k, ROUTING_MODES[spec.routing], int(spec.normalize),
         spec.router_softcap, spec.routed_scale, spec.num_groups, spec.topk_groups)  # fmt: skip
    chosen = np.fromfile(tmp_path / "chosen.bin", np.int32).reshape(tokens, k)
    weights = np.fromfile(tmp_path / "weights.bin", np.float32).reshape(tokens, k)
    return chosen, weights


def _logits(rng: np.random.Generator, tokens: int, experts: int, ties: bool) -> np.ndarray:
    """Normal logits, or with `ties` on a grid of 0.25 over [-1, 1] (9 values: every token's top k ties)."""
    if ties:
        return (rng.integers(-4, 5, (tokens, experts)) * 0.25).astype(np.float32)
    return rng.standard_normal((tokens, experts)).astype(np.float32)


def _check(exe: Path, tmp_path: Path, logits: np.ndarray, spec: MoeSpec, bias: np.ndarray | None, seed: int):
    assert routing_unsupported(spec) is None
    chosen, weights = _route(exe, tmp_path, logits, spec, bias)
    want_w, want = route(np, logits, spec, bias)
    assert (chosen == want).all(), f"seed {seed}: experts differ in rows {np.nonzero((chosen != want).any(1))[0]}"
    assert np.allclose(weights, want_w, rtol=1e-5, atol=1e-7), f"seed {seed}"


@pytest.mark.parametrize("experts", [256, 512])
@pytest.mark.parametrize(("routing", "normalize", "k", "softcap"), [
    ("softmax_topk", True, 8, 0.0),  # Qwen3.5-MoE, Qwen3-Next
    ("softmax_topk", False, 16, 0.0),  # the most picks the kernels take
    ("topk_softmax", False, 4, 0.0),  # GPT-OSS
    ("softmax_topk", True, 1, 2.0),  # a router softcap
])  # fmt: skip
@pytest.mark.parametrize("ties", [False, True])
def test_softmax_routings_emulated(moe_emu, tmp_path, request, experts, routing, normalize, k, softcap, ties):
    rng, seed = fresh_rng(request.node.nodeid)
    spec = MoeSpec(experts, k, 64, routing=routing, normalize=normalize, router_softcap=softcap)
    _check(moe_emu, tmp_path, _logits(rng, 13, experts, ties), spec, None, seed)


@pytest.mark.parametrize(("experts", "groups", "topk_groups", "k"), [
    (256, 8, 4, 8),  # DeepSeek-V3's shape: 8 groups of 32, the best 4 compete
    (256, 1, 1, 8),  # Nemotron-H, Laguna: one group
    (512, 64, 6, 16),  # the most groups: two a lane
    (512, 16, 1, 8),  # one group competes: every pick from it
    (1024, 2, 1, 8),  # the most experts: 32 a lane
])  # fmt: skip
@pytest.mark.parametrize("ties", [False, True])
def test_sigmoid_grouped_routing_emulated(moe_emu, tmp_path, request, experts, groups, topk_groups, k, ties):
    """Sigmoid scores, the picks on score + bias within the best groups, weights renormalised times a scale;
    with `ties`, no bias (tied logits tie the choices) and many groups' two best sum alike."""
    rng, seed = fresh_rng(request.node.nodeid)
    spec = MoeSpec(experts, k, 64, routing="sigmoid_grouped", normalize=True, num_groups=groups,
                   topk_groups=topk_groups, routed_scale=2.5, router_softcap=0.0 if ties else 1.5)  # fmt: skip
    bias = None if ties else (rng.standard_normal(experts) * 0.1).astype(np.float32)
    _check(moe_emu, tmp_path, _logits(rng, 6, experts, ties), spec, bias, seed)


def test_route_refuses_more_experts_than_a_warp_holds():
    spec = MoeSpec(MAX_EXPERTS + 32, 8, 64)
    assert "experts" in routing_unsupported(spec)
    assert routing_unsupported(MoeSpec(MAX_EXPERTS, 8, 64)) is None


def test_logits_inside_a_wider_product_emulated(moe_emu, tmp_path, request):
    """Router logits as the first 256 columns of 259-wide rows (Qwen3.5-MoE's router and shared-expert gate in one
    product): the same picks and weights as the contiguous logits; the extra columns are never read."""
    rng, seed = fresh_rng(request.node.nodeid)
    spec = MoeSpec(256, 8, 64)
    logits = _logits(rng, 13, 256, ties=True)
    wide = np.concatenate([logits, np.full((13, 3), 1e4, np.float32)], axis=1)  # they would win every pick
    (tmp_path / "logits.bin").write_bytes(wide.tobytes())
    _run(moe_emu, "route", tmp_path, 13, 256, 8, ROUTING_MODES[spec.routing], int(spec.normalize),
         spec.router_softcap, spec.routed_scale, spec.num_groups, spec.topk_groups, 259)  # fmt: skip
    chosen = np.fromfile(tmp_path / "chosen.bin", np.int32).reshape(13, 8)
    weights = np.fromfile(tmp_path / "weights.bin", np.float32).reshape(13, 8)
    want_w, want = route(np, logits, spec, None)
    assert (chosen == want).all(), f"seed {seed}"
    assert np.allclose(weights, want_w, rtol=1e-5, atol=1e-7), f"seed {seed}"
