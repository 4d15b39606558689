"""Gemma 4's experts off the GPU: moe.cu on the SIMT emulator against the numpy layer, and the premise of the GPU
suite's comparison of gemma4-tiny-moe with numpy.

moe.cu: the tensors of bench/make_random_gguf.py's
gemma4-tiny-moe as the model loads them (gemma4.adapt_tensors: the fused `ffn_gate_up_exps` split into per-expert
gate and up views of Q4_K rows, the router's input scale folded into its projection), GELU-tanh experts
(ACTIVATION_KINDS 3) and a down projection of 96 columns that 256-weight blocks do not tile, so llama.cpp's
fallback formats Q5_0 (layer 1: 66-byte rows, not 16-byte aligned) and Q8_0 (layer 2, one of Q4_K_M's
Q6_K layers), and the learned scale of each expert's output (`ffn_down_exps.scale`, on the routing weights as
kernels/moe.py's `route_scaled` puts it). Not marked `gpu`: the kernels run as host threads.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from cuda_samples import rel_err
from emulator import build as _build
from emulator import run as _run

from app.engine.backend.cpu import CpuBackend
from app.engine.kernels.moe import ACTIVATION_KINDS, ROUTING_MODES
from app.engine.layers.moe import MoE
from app.engine.loader.weights import open_checkpoint
from app.engine.models import gemma4
from app.engine.moe.ops import route

BENCH = Path(__file__).resolve().parents[3] / "bench"
TOKENS = 5


@pytest.fixture(scope="module")
def moe_emu(tmp_path_factory) -> Path:
    return _build(tmp_path_factory, "moe_main.cpp")


@pytest.fixture(scope="module")
def tiny_moe_path(tmp_path_factory) -> Path:
    """bench/make_random_gguf.py's gemma4-tiny-moe (random Q4_K_M), as the GPU suite writes it."""
    sys.path.insert(0, str(BENCH))
    import make_random_gguf

    path = tmp_path_factory.mktemp("gemma4-moe") / "gemma4-tiny-moe.gguf"
    make_random_gguf.write("gemma4-tiny-moe", "q4_k_m", path)
    return path


@pytest.fixture(scope="module")
def tiny_moe(tiny_moe_path):
    """gemma4-tiny-moe's config and its tensors as the model adapts them."""
    checkpoint = open_checkpoint(tiny_moe_path)
    cfg = gemma4.config_from_gguf(checkpoint.metadata, 1024)
    return cfg, gemma4.adapt_tensors(checkpoint.tensors, cfg)


@pytest.mark.parametrize(("layer", "down_format"), [(1, "Q5_0"), (2, "Q8_0")])
def test_gemma4_experts_emulated(moe_emu, tiny_moe, tmp_path, layer: int, down_format: str) -> None:
    cfg, tensors = tiny_moe
    spec, p = cfg.moe, f"blk.{layer}"
    moe = MoE(CpuBackend(), tensors, p, spec)
    assert moe.expert_scale is not None
    gate = [tensors[f"{p}.ffn_gate_exps.{e}.weight"] for e in range(spec.num_experts)]
    up = [tensors[f"{p}.ffn_up_exps.{e}.weight"] for e in range(spec.num_experts)]
    down = tensors[f"{p}.ffn_down_exps.weight"]
    assert (gate[0].qtype.name, down.qtype.name, down.shape[-1]) == ("Q4_K", down_format, 96)
    rng = np.random.default_rng(layer)
    x = rng.standard_normal((TOKENS, cfg.hidden_size)).astype(np.float32)
    router_input = rng.standard_normal((TOKENS, cfg.hidden_size)).astype(np.float32)
    logits = moe.router(router_input)
    expected = moe(x, router_input=router_input)

    (tmp_path / "x.bin").write_bytes(x.tobytes())
    (tmp_path / "logits.bin").write_bytes(logits.astype(np.float32).tobytes())
    for name, parts in (("gate", gate), ("up", up)):
        (tmp_path / f"{name}.bin").write_bytes(b"".join(np.ascontiguousarray(w.data).tobytes() for w in parts))
    (tmp_path / "down.bin").write_bytes(np.ascontiguousarray(down.data).tobytes())
    (tmp_path / "expert_scale.bin").write_bytes(moe.expert_scale.astype(np.float32).tobytes())
    _run(moe_emu, "moe", f"q4_k,{down_format.lower()}", tmp_path, TOKENS, cfg.hidden_size, spec.intermediate_size,
         spec.num_experts, spec.num_used, ROUTING_MODES[spec.routing], int(spec.normalize),
         ACTIVATION_KINDS["gelu_tanh"], gate[0].data.shape[-1], down.data.shape[-1], 0.0, 1.0, 1, 1)  # fmt: skip

    chosen = np.fromfile(tmp_path / "chosen.bin", np.int32).reshape(TOKENS, spec.num_used)
    weights, want = route(np, logits, spec)
    assert (chosen == want).all()
    np.testing.assert_allclose(np.fromfile(tmp_path / "weights.bin", np.float32).reshape(TOKENS, -1), weights, rtol=1e-5)
    out = np.fromfile(tmp_path / "out.bin", np.float32).reshape(TOKENS, cfg.hidden_size)
    assert rel_err(out, expected) < 1e-5


def test_the_gpu_suites_moe_prompts_route_no_token_near_a_tie(tiny_moe_path, monkeypatch) -> None:
    """test_cuda_families2.py compares gemma4-tiny-moe on CUDA with numpy only on prompts whose numpy run makes every
    routing choice at least MOE_MARGIN from a tie (MOE_PROMPTS says why): checked here too, where no GPU is."""
    from test_cuda_families2 import MOE_MARGIN, moe_reference

    reference, margins = moe_reference(str(tiny_moe_path), monkeypatch)
    assert min(margins) >= MOE_MARGIN
    assert all(len(r["token_ids"]) == 8 for r in reference)
