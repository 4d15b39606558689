"""RMS normalisation with a learned scale."""

from __future__ import annotations

from typing import Any

from app.engine.backend.base import Backend, add_and_norm
from app.engine.quant.dispatch import QuantizedTensor


class RMSNorm:
    def __init__(self, backend: Backend, weight: QuantizedTensor, eps: float) -> None:
        self.backend = backend
        self.weight = backend.load_weight(weight)
        self.eps = eps

    def __call__(self, x: Any) -> Any:
        return self.backend.rms_norm(x, self.weight, self.eps)

    def join(self, x: Any, stream: Any, scale: Any | None = None) -> Any:
        """`(norm(x) + stream) * scale`: the normalised output joined to the residual `stream`, one launch
        where the backend fuses it (scale: a one-element weight, None for 1)."""
        return self.backend.rms_norm_join(x, self.weight, self.eps, stream, scale)

    def add_and_norm(self, x: Any, residual: Any | None) -> tuple[Any, Any]:
        """Fold `x` into the residual stream and normalise it: `(normed, new_residual)`."""
        return add_and_norm(self.backend, x, residual, self.weight, self.eps)

    def add_norm_linear(self, x: Any, residual: Any | None, weight: Any) -> tuple[Any, Any]:
        """`linear` of `add_and_norm`'s output, and the new residual: one launch where the backend
        fuses the norm into the product (one decode token)."""
        return self.backend.add_rms_norm_linear(x, residual, self.weight, self.eps, weight)

    def add_norm_gated_linear(
        self, x: Any, residual: Any | None, gate_up: Any, kind: str, then: Any = None
    ) -> tuple[Any, Any]:
        """`gated_linear` of `add_and_norm`'s output, and the new residual (as add_norm_linear); `then`: the
        weight the result goes into next, whose product the backend may give it in the form of."""
        return self.backend.add_rms_norm_gated_linear(x, residual, self.weight, self.eps, gate_up, kind, then)
