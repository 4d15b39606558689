"""The numpy backend's weight records: a checkpoint tensor with its float32 values made on first use,
and weights that multiply the same input kept side by side. A module of their own so the streamed
experts (cpu_experts.py) and the backend (cpu.py) both use them without importing each other."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.engine.quant.dispatch import QuantizedTensor


class CpuWeight:
    """A checkpoint tensor plus its float32 values, dequantized on first use."""

    def __init__(self, tensor: QuantizedTensor) -> None:
        self.tensor = tensor
        self._dense: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.tensor.shape

    @property
    def dense(self) -> np.ndarray:
        if self._dense is None:
            self._dense = np.ascontiguousarray(self.tensor.dequantize(), dtype=np.float32)
        return self._dense

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Selected rows without dequantizing the whole matrix (embedding lookups)."""
        if self._dense is not None:
            return self._dense[ids]
        return self.tensor.dequantize(rows=ids)


@dataclass(frozen=True)
class CpuFusedWeight:
    """Weights that multiply the same input, kept apart: `linear` runs them one by one."""

    parts: tuple[CpuWeight, ...]
    biases: tuple[np.ndarray | None, ...]

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(p.shape[0] for p in self.parts), self.parts[0].shape[1])
