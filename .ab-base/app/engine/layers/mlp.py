"""The feed-forward block: gated, `down(act(gate(x)) * up(x))`, or plain, `down(act(up(x)))`.

gate and up are one fused weight and `gated_linear` applies the activation in the same
pass (one GEMV launch in decode); the numpy backend runs the unfused composition. The decoder
layer calls the two halves itself: gate/up together with the norm in front of them
(`RMSNorm.add_norm_gated_linear`), then `down`. A checkpoint without `ffn_gate` has the plain
form (Nemotron-H: squared ReLU), which the layer calls whole.
"""

from __future__ import annotations

from typing import Any

from app.engine.backend.base import Backend
from app.engine.layers.linear import Linear
from app.engine.moe.ops import ungated_activation
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.specs import UNGATED_ACTIVATIONS


class GatedMLP:
    gated = True

    def __init__(
        self, backend: Backend, tensors: dict[str, QuantizedTensor], prefix: str, activation: str
    ) -> None:
        self.backend = backend
        gate = Linear(backend, tensors[f"{prefix}.ffn_gate.weight"])
        up = Linear(backend, tensors[f"{prefix}.ffn_up.weight"])
        self.gate_up = backend.fuse_linear([gate.weight, up.weight], [None, None])
        self.down = Linear(backend, tensors[f"{prefix}.ffn_down.weight"])
        self.activation = activation


class UpDownMLP:
    """`down(act(up(x)))`, for the activations without a gate (UNGATED_ACTIVATIONS)."""

    gated = False

    def __init__(self, backend: Any, up: QuantizedTensor, down: QuantizedTensor, activation: str) -> None:
        self.backend, self.activation = backend, activation
        self.up, self.down = Linear(backend, up), Linear(backend, down)

    def __call__(self, x: Any) -> Any:
        return self.down(ungated_activation(self.backend.xp, self.up(x), self.activation))


def dense_mlp(
    backend: Any, tensors: dict[str, QuantizedTensor], prefix: str, activation: str
) -> GatedMLP | UpDownMLP:
    """The layer's dense feed-forward, in the form its activation takes."""
    if activation in UNGATED_ACTIVATIONS:
        return UpDownMLP(
            backend, tensors[f"{prefix}.ffn_up.weight"], tensors[f"{prefix}.ffn_down.weight"], activation
        )
    return GatedMLP(backend, tensors, prefix, activation)


