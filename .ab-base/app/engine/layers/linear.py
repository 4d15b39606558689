"""A projection `x @ W.T (+ b)` over a weight kept in its checkpoint format."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.engine.backend.base import Backend
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES


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


def stack_rows(top: QuantizedTensor, bottom: QuantizedTensor, name: str) -> QuantizedTensor:
    """`[top; bottom]` as one tensor: the file's bytes where both share a whole-row format, else float32."""
    if top.qtype == bottom.qtype and top.scales is None and bottom.scales is None:
        data = np.concatenate([np.asarray(top.data), np.asarray(bottom.data)])
        return QuantizedTensor(name, top.qtype, (top.shape[0] + bottom.shape[0], top.shape[1]), data)
    values = np.concatenate([top.dequantize(), bottom.dequantize()]).astype(np.float32)
    return QuantizedTensor.from_float(name, values, QUANT_TYPES["F32"])
