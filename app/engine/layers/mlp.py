"""The gated feed-forward block: `down(act(gate(x)) * up(x))`.

gate and up are one fused weight and `gated_linear` applies the activation in the same
pass (one GEMV launch in decode); the numpy backend runs the unfused composition. The decoder
layer calls the two halves itself: gate/up together with the norm in front of them
(`RMSNorm.add_norm_gated_linear`), then `down`.
"""

from __future__ import annotations

from app.engine.backend.base import Backend
from app.engine.layers.linear import Linear
from app.engine.quant.dispatch import QuantizedTensor


class GatedMLP:
    def __init__(
        self, backend: Backend, tensors: dict[str, QuantizedTensor], prefix: str, activation: str
    ) -> None:
        self.backend = backend
        gate = Linear(backend, tensors[f"{prefix}.ffn_gate.weight"])
        up = Linear(backend, tensors[f"{prefix}.ffn_up.weight"])
        self.gate_up = backend.fuse_linear([gate.weight, up.weight], [None, None])
        self.down = Linear(backend, tensors[f"{prefix}.ffn_down.weight"])
        self.activation = activation
