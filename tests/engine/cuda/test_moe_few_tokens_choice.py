"""Which MoE path kernels/moe.py's moe_forward takes (host side, no GPU): up to FUSED_DECODE_MAX_TOKENS tokens
the grouping-free moe_few_tokens where the switch is on and the experts suit it, else the grouped path; the switch
from PADDOCK_MOE_FUSED_DECODE through KernelOptions to the backend's call."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from app.engine import envs
from app.engine.kernels import moe as kmoe
from app.engine.kernels.moe import FUSED_DECODE_MAX_TOKENS, StackedExperts, few_tokens_serve
from app.engine.kernels.options import KernelOptions
from app.engine.models.config import MoeSpec

SPEC = MoeSpec(32, 8, 256)


def _experts(qtype: str = "Q4_K", n_experts: int = 32, rows: int = 256, row_bytes: int = 144) -> StackedExperts:
    return StackedExperts(None, qtype, n_experts, rows, 256, row_bytes)


def test_few_tokens_serve_up_to_the_bound_with_every_expert_in_its_slot() -> None:
    gate, up = _experts(), _experts()
    assert FUSED_DECODE_MAX_TOKENS >= 1
    assert all(few_tokens_serve(n, SPEC, gate, up) for n in range(1, FUSED_DECODE_MAX_TOKENS + 1))
    assert not few_tokens_serve(0, SPEC, gate, up)
    assert not few_tokens_serve(FUSED_DECODE_MAX_TOKENS + 1, SPEC, gate, up)
    assert not few_tokens_serve(1, SPEC, gate, _experts(n_experts=16))  # streamed: 16 slots of 32 experts
    assert not few_tokens_serve(1, SPEC, _experts("Q5_K", row_bytes=176), up)  # gate and up of two formats
    assert few_tokens_serve(1, MoeSpec(32, 8, 256, activation="relu2"), None, up)  # ungated: up alone


class _Calls:
    """moe_forward's collaborators replaced by recorders: which path ran, with what."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.path: list[str] = []
        self.routed_with: Any = None

        def record(name: str, result: Any):
            def fn(*args: Any, **kwargs: Any) -> Any:
                self.path.append(name)
                if name in ("moe_route", "route_grouped"):
                    self.routed_with = args[2] if len(args) > 2 else None
                return result

            return fn

        monkeypatch.setattr(kmoe, "moe_route", record("moe_route", ("chosen", "weights")))
        monkeypatch.setattr(kmoe, "route_grouped", record("route_grouped", ("chosen", "weights", "plan")))
        monkeypatch.setattr(kmoe, "moe_few_tokens", record("moe_few_tokens", "out"))
        monkeypatch.setattr(kmoe, "moe_experts", record("moe_experts", "out"))


@pytest.mark.parametrize("n_tok", [1, FUSED_DECODE_MAX_TOKENS, FUSED_DECODE_MAX_TOKENS + 1])
@pytest.mark.parametrize("fused_decode", [True, False])
def test_moe_forward_takes_the_few_tokens_path_only_where_it_serves(monkeypatch, n_tok, fused_decode) -> None:
    calls = _Calls(monkeypatch)
    x, logits = np.zeros((n_tok, 256), np.float32), np.zeros((n_tok, 32), np.float32)
    out = kmoe.moe_forward(x, logits, SPEC, _experts(), _experts(), _experts(), None, "bias", fused_decode)
    assert out == "out"
    if fused_decode and n_tok <= FUSED_DECODE_MAX_TOKENS:
        assert calls.path == ["moe_route", "moe_few_tokens"]
    else:
        assert calls.path == ["route_grouped", "moe_experts"]
    assert calls.routed_with == "bias"  # the score bias reaches either router


@pytest.mark.parametrize(("text", "expected"), [("", True), ("1", True), ("0", False)])
def test_the_switch_reaches_kernel_options(monkeypatch, text: str, expected: bool) -> None:
    monkeypatch.setenv("PADDOCK_MOE_FUSED_DECODE", text)
    envs.reload()
    try:
        assert KernelOptions().moe_fused_decode is expected
    finally:
        monkeypatch.undo()
        envs.reload()


def test_bad_switch_values_are_named(monkeypatch) -> None:
    monkeypatch.setenv("PADDOCK_MOE_FUSED_DECODE", "maybe")
    envs.reload()
    try:
        with pytest.raises(ValueError, match="PADDOCK_MOE_FUSED_DECODE"):
            KernelOptions()
    finally:
        monkeypatch.undo()
        envs.reload()


@pytest.mark.parametrize("fused_decode", [True, False])
def test_the_cuda_backend_hands_its_option_to_moe_forward(monkeypatch, fused_decode: bool) -> None:
    from app.engine.backend.cuda import backend as cuda_backend

    seen: dict[str, Any] = {}
    monkeypatch.setattr(cuda_backend._moe, "moe_forward", lambda *a, **kw: seen.update(kw) or "out")
    backend = SimpleNamespace(
        _f32=lambda a: a, _rows=lambda a: a, kernel_options=KernelOptions(moe_fused_decode=fused_decode)
    )
    x, logits = np.zeros((1, 256), np.float32), np.zeros((1, 33), np.float32)[:, :32]  # router rows + a gate row
    assert cuda_backend.CudaBackend.moe(backend, x, logits, SPEC, (_experts(), _experts(), _experts())) == "out"
    assert seen["fused_decode"] is fused_decode and seen["shared"] is None
    shared, gate = np.zeros((1, 256), np.float32), np.zeros((1, 33), np.float32)[:, 32:]
    cuda_backend.CudaBackend.moe(backend, x, logits, SPEC, (_experts(),) * 3, shared=(shared, gate))
    join = seen["shared"]  # the shared expert goes on to the combine, its gate column read in place
    assert isinstance(join, kmoe.SharedJoin) and join.rows is shared and join.logit is gate


def test_moe_few_tokens_names_what_it_cannot_take() -> None:
    x, weights = np.zeros((2, 256), np.float32), np.zeros((2, 8), np.float32)
    experts = (_experts(), _experts(), _experts())
    with pytest.raises(ValueError, match=r"chosen \(2, 4\) for 2 tokens of 8 experts"):
        kmoe.moe_few_tokens(x, np.zeros((2, 4), np.int32), weights, SPEC, *experts)
    with pytest.raises(ValueError, match="relu2"):  # squared ReLU experts have no gate product
        kmoe.moe_few_tokens(x, np.zeros((2, 8), np.int32), weights, MoeSpec(32, 8, 256, activation="relu2"), *experts)
    with pytest.raises(ValueError, match="gelu"):
        kmoe.moe_few_tokens(x, np.zeros((2, 8), np.int32), weights, MoeSpec(32, 8, 256, activation="gelu"), *experts)
