"""A projection `x @ W.T (+ b)` over a weight kept in its checkpoint format."""

from __future__ import annotations

from typing import Any

from app.engine.backend.base import Backend
from app.engine.quant.dispatch import QuantizedTensor


class Linear:
    def __init__(self, backend: Backend, weight: QuantizedTensor, bias: QuantizedTensor | None = None) -> None:
        self.backend = backend
        self.out_features, self.in_features = weight.shape
        self.weight = backend.load_weight(weight)
        self.bias = backend.load_weight(bias) if bias is not None else None

    @classmethod
    def sharing(cls, backend: Backend, loaded_weight: Any, shape: tuple[int, ...]) -> Linear:
        """A projection over a weight the backend already holds (tied embeddings)."""
        layer = cls.__new__(cls)
        layer.backend = backend
        layer.out_features, layer.in_features = shape
        layer.weight, layer.bias = loaded_weight, None
        return layer

    def __call__(self, x: Any) -> Any:
        return self.backend.linear(x, self.weight, self.bias)
