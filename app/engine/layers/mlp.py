"""The gated feed-forward block: `down(act(gate(x)) * up(x))`."""

from __future__ import annotations

from typing import Any

from app.engine.layers.linear import Linear
from app.engine.quant.dispatch import QuantizedTensor


class GatedMLP:
    def __init__(
        self, backend: Any, tensors: dict[str, QuantizedTensor], prefix: str, activation: str
    ) -> None:
        self.backend = backend
        self.gate = Linear(backend, tensors[f"{prefix}.ffn_gate.weight"])
        self.up = Linear(backend, tensors[f"{prefix}.ffn_up.weight"])
        self.down = Linear(backend, tensors[f"{prefix}.ffn_down.weight"])
        self.activation = activation

    def __call__(self, x: Any) -> Any:
        return self.down(self.backend.gated_activation(self.gate(x), self.up(x), self.activation))
