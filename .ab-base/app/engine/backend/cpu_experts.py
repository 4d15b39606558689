"""The numpy backend's stand-in for a MoE layer whose experts stream from host RAM to the GPU.

Every expert stays on the "host" (its checkpoint tensors, dequantized to float32 once, on first
fetch); the layer's "device" is a fixed set of slot arrays, one `[slots, rows, cols]` array per
projection, into which the residency manager's copies are made (moe/residency.py). The
products then read the slots only, through the same backend ops and in the same order as with
every expert resident, so the tokens are exactly the same: the oracle for the CUDA path.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from app.engine.backend.cpu_weights import CpuFusedWeight
from app.engine.moe.residency import Copy, LayerResidency
from app.engine.quant.dispatch import QuantizedTensor


class SlotWeight:
    """A slot's matrix as `CpuBackend.linear` reads a weight (`dense`, `shape`)."""

    def __init__(self, dense: np.ndarray) -> None:
        self.dense = dense
        self.shape = dense.shape


class CpuStreamedExperts:
    syncs_host = True  # the router's choices are read on the host to plan the copies

    def __init__(
        self,
        weights: Sequence[Sequence[QuantizedTensor]],
        biases: Sequence[Sequence[QuantizedTensor | None]],
        residency: LayerResidency,
    ) -> None:
        self.residency = residency
        self._host = [list(ws) for ws in weights]  # (gate, up, down) x expert
        self._host_biases = [list(bs) for bs in biases]
        self._dense: dict[tuple[int, int], np.ndarray] = {}
        n = residency.num_slots
        self.slots = [np.zeros((n, *ws[0].shape), np.float32) for ws in weights]
        has_bias = [any(b is not None for b in bs) for bs in biases]
        self.slot_biases = [
            np.zeros((n, ws[0].shape[0]), np.float32) if bias else None
            for ws, bias in zip(weights, has_bias, strict=True)
        ]
        gate, up, down = self.slots
        gate_b, up_b, down_b = self.slot_biases
        self.gate_up = [
            CpuFusedWeight((SlotWeight(gate[s]), SlotWeight(up[s])), (_row(gate_b, s), _row(up_b, s)))
            for s in range(n)
        ]
        self.down = [SlotWeight(down[s]) for s in range(n)]
        self.down_biases = [_row(down_b, s) for s in range(n)]
        self.fetch([Copy(e, s) for s, e in enumerate(residency.expert_in) if e >= 0])  # the hot set

    def fetch(self, copies: Sequence[Copy]) -> None:
        """Copy each expert's three projections (and biases) from the host into its slot."""
        for copy in copies:
            for part, slots in enumerate(self.slots):
                slots[copy.slot] = self._host_dense(part, copy.expert)
                bias, target = self._host_biases[part][copy.expert], self.slot_biases[part]
                if target is not None:
                    target[copy.slot] = 0.0 if bias is None else bias.dequantize().reshape(-1)

    def _host_dense(self, part: int, expert: int) -> np.ndarray:
        key = (part, expert)
        if key not in self._dense:
            self._dense[key] = np.ascontiguousarray(self._host[part][expert].dequantize(), dtype=np.float32)
        return self._dense[key]


def _row(values: np.ndarray | None, slot: int) -> np.ndarray | None:
    return None if values is None else values[slot]
