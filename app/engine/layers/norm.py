"""RMS normalisation with a learned scale."""

from __future__ import annotations

from typing import Any

from app.engine.quant.dispatch import QuantizedTensor


class RMSNorm:
    def __init__(self, backend: Any, weight: QuantizedTensor, eps: float) -> None:
        self.backend = backend
        self.weight = backend.load_weight(weight)
        self.eps = eps

    def __call__(self, x: Any) -> Any:
        return self.backend.rms_norm(x, self.weight, self.eps)

    def add_and_norm(self, x: Any, residual: Any | None) -> tuple[Any, Any]:
        """Fold `x` into the residual stream and normalise it: `(normed, new_residual)`."""
        if residual is None:
            return self.backend.rms_norm(x, self.weight, self.eps), x
        return self.backend.add_rms_norm(x, residual, self.weight, self.eps)
