"""Token embedding lookup, optionally scaled (Gemma multiplies by sqrt(hidden))."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.engine.backend.base import Backend
from app.engine.quant.dispatch import QuantizedTensor


class Embedding:
    def __init__(self, backend: Backend, weight: QuantizedTensor, scale: float | None = None) -> None:
        self.backend = backend
        self.num_embeddings, self.dim = weight.shape
        self.weight = backend.load_weight(weight)
        self.scale = None if scale is None else np.float32(scale)

    def __call__(self, token_ids: Any) -> Any:
        x = self.backend.embedding(self.weight, token_ids)
        return x * self.scale if self.scale is not None else x
