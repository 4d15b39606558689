"""A mixture of experts' weights on the GPU as kernels/moe.py's grouped products read them.

Each projection (gate, up, down) of one layer goes up as one stacked buffer `[E, rows, row_bytes]`
in its checkpoint's block format, whether the checkpoint stacks its experts (GGUF's
`ffn_*_exps`, split into row views by layers/moe.py) or lists them one by one (Hugging Face
folders): the experts are copied into place once, on the host, and uploaded together. moe.cu
decodes every block format of quant.cuh; the split formats (FP8, NVFP4 and MXFP4 with a separate
scale grid) it does not, so those layers stay on the per-expert products (`unsupported`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from app.engine.backend.cuda.weights import _upload
from app.engine.kernels.moe import (
    ACTIVATION_KINDS,
    MAX_USED,
    PAD_BYTES,
    StackedExperts,
    moe_experts,
    route_scaled,
    routing_unsupported,
)
from app.engine.moe.residency import Copy, LayerResidency
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.specs import MoeSpec

ACTIVATIONS = tuple(ACTIVATION_KINDS)  # what moe_gated computes (relu2: ungated, up and down only)


def unsupported(spec: MoeSpec, projections: Sequence[Sequence[QuantizedTensor]]) -> str | None:
    """Why moe.cu cannot run these experts (a sentence), or None when it can."""
    if spec.activation not in ACTIVATIONS:
        return f"activation {spec.activation!r} (the kernels have {', '.join(ACTIVATIONS)})"
    if not 1 <= spec.num_used <= min(MAX_USED, spec.num_experts):
        return f"{spec.num_used} experts per token (the kernels take 1 to {MAX_USED})"
    routing = routing_unsupported(spec)
    if routing is not None:
        return routing
    for experts in projections:
        first = experts[0]
        if first.qtype.split:
            return f"{first.name!r} is {first.qtype.name}, whose scales are a separate tensor"
        if len(first.shape) != 2 or first.shape[-1] % 32:
            return f"{first.name!r} has shape {first.shape}: rows must be whole 32-weight units"
        odd = next((w for w in experts if w.qtype != first.qtype or w.shape != first.shape), None)
        if odd is not None:
            return f"{odd.name!r} ({odd.qtype.name}, {odd.shape}) differs from {first.name!r}"
    return None


def stacked_bytes(weights: Sequence[QuantizedTensor]) -> np.ndarray:
    """The experts' blocks back to back, `E x rows x row_bytes` plus the kernels' read padding."""
    stride = weights[0].data.nbytes
    flat = np.zeros(len(weights) * stride + PAD_BYTES, np.uint8)
    for e, w in enumerate(weights):
        flat[e * stride : (e + 1) * stride] = np.ascontiguousarray(w.data).reshape(-1)
    return flat


def stacked_biases(biases: Sequence[QuantizedTensor | None], rows: int) -> np.ndarray | None:
    """float32 `[E, rows]` (zeros for an expert without one), or None when no expert has a bias."""
    if all(b is None for b in biases):
        return None
    values = np.zeros((len(biases), rows), np.float32)
    for e, b in enumerate(biases):
        if b is not None:
            values[e] = b.dequantize().reshape(-1)
    return values


def upload_experts(weights: Sequence[QuantizedTensor], biases: Sequence[QuantizedTensor | None]) -> StackedExperts:
    """One projection's experts (each `[rows, cols]`, one format: see `unsupported`) and their
    biases (None where an expert has none) as one stacked device buffer."""
    first = weights[0]
    rows, cols = first.shape
    what = f"the {len(weights)} experts of {first.name!r} ({first.qtype.name})"
    bias = stacked_biases(biases, rows)
    return StackedExperts(
        _upload(stacked_bytes(weights), what), first.qtype.name, len(weights), rows, cols,
        first.qtype.row_bytes(cols), None if bias is None else _upload(bias, f"the biases of {what}"),
    )  # fmt: skip


# -- experts streamed from pinned host RAM (--experts-on-gpu N) ---------------------------------


class StreamedExperts:
    """A MoE layer whose experts live in pinned host RAM, N hot ones and S staged ones in device slots.

    Per projection the host keeps every expert's blocks back to back (the stacked layout), the
    device `num_slots` of them in a slot-indexed `StackedExperts` the grouped kernels read as if
    it held `num_slots` experts; the residency manager (moe/residency.py) says which
    expert is in which slot and which to copy. Copies run on a side stream from pinned memory
    (cudaMemcpyAsync), ordered after the work already queued on the compute stream (a slot may
    still be read by the previous step) and waited on, through an event, only by the products of
    the cold experts they bring: the layer's hot experts run meanwhile (`streamed_moe`)."""

    syncs_host = True  # the router's choices are read back to plan the copies

    def __init__(self, spec: MoeSpec, weights: Sequence[Sequence[QuantizedTensor]],
                 biases: Sequence[Sequence[QuantizedTensor | None]], residency: LayerResidency) -> None:  # fmt: skip
        import cupy as cp

        self.spec, self.residency = spec, residency
        self.copy_stream = cp.cuda.Stream(non_blocking=True)
        self._pinned: list[Any] = []
        self.host: list[np.ndarray] = []  # per projection: uint8 [E, stride], pinned
        self.full_biases: list[Any] = []  # per projection: float32 [E, rows] on the device, or None
        self.slots: list[StackedExperts] = []
        for ws, bs in zip(weights, biases, strict=True):
            first = ws[0]
            rows, cols = first.shape
            stride = first.data.nbytes
            host = self._pinned_array(len(ws) * stride).reshape(len(ws), stride)
            for e, w in enumerate(ws):  # straight from the (memory-mapped) file into pinned pages
                host[e] = np.ascontiguousarray(w.data).reshape(-1)
            self.host.append(host)
            bias = stacked_biases(bs, rows)
            what = f"the {residency.num_slots} expert slots of {first.name!r} ({first.qtype.name})"
            self.full_biases.append(None if bias is None else _upload(bias, f"the biases of {what}"))
            slot_bias = None if bias is None else cp.zeros((residency.num_slots, rows), cp.float32)
            data = _upload(np.zeros(residency.num_slots * stride + PAD_BYTES, np.uint8), what)
            self.slots.append(StackedExperts(data, first.qtype.name, residency.num_slots, rows, cols,
                                             first.qtype.row_bytes(cols), slot_bias))  # fmt: skip
        hot = [Copy(e, s) for s, e in enumerate(residency.expert_in) if e >= 0]
        cp.cuda.get_current_stream().wait_event(self.upload(hot))
        self.copy_stream.synchronize()

    def upload(self, copies: Sequence[Copy]) -> Any:
        """Queue the copies on the side stream after the compute stream's queued work; the event
        that marks them done."""
        import cupy as cp

        self.copy_stream.wait_event(cp.cuda.get_current_stream().record())
        with self.copy_stream:
            for copy in copies:
                for host, slots, full_bias in zip(self.host, self.slots, self.full_biases, strict=True):
                    stride = slots.expert_stride
                    cp.cuda.runtime.memcpyAsync(
                        slots.data.data.ptr + copy.slot * stride, host[copy.expert].ctypes.data, stride,
                        cp.cuda.runtime.memcpyHostToDevice, self.copy_stream.ptr,
                    )  # fmt: skip
                    if full_bias is not None:
                        slots.bias[copy.slot] = full_bias[copy.expert]
        return self.copy_stream.record()

    def _pinned_array(self, nbytes: int) -> np.ndarray:
        import cupy as cp

        memory = cp.cuda.alloc_pinned_memory(max(1, nbytes))
        self._pinned.append(memory)  # np.frombuffer holds a view, not the allocation: keep it alive
        return np.frombuffer(memory, np.uint8, nbytes)


def streamed_moe(
    x: Any, logits: Any, spec: MoeSpec, experts: StreamedExperts, expert_scale: Any = None, score_bias: Any = None,
    int_x: bool = False,
) -> Any:  # fmt: skip
    """The experts' weighted sum with cold experts copied in for this step.

    The router's choices come back to the host (the one sync of the layer); the residency manager
    plans the copies; the hot experts' products run at once while the first round's copies are in
    flight, and each round's cold experts run after its copies land. The passes' partial sums are
    added, so the result equals the all-resident one up to float32 rounding. `int_x`: moe_experts'."""
    import cupy as cp

    chosen, weights = route_scaled(logits, spec, expert_scale, score_bias)
    rounds = experts.residency.step(cp.asnumpy(chosen))
    stream = cp.cuda.get_current_stream()
    hot = experts.residency.hot_slots
    promoted = [c for r in rounds[:1] for c in r.copies if c.slot < hot]  # a rebalance: before the hot pass
    if promoted:
        stream.wait_event(experts.upload(promoted))
    passes: list[tuple[list[int], list[int], list[Copy]]] = [
        ([e for e, s in zip(r.experts, r.slots, strict=True) if s >= hot],
         [s for s in r.slots if s >= hot], [c for c in r.copies if c.slot >= hot])
        for r in rounds
    ]  # fmt: skip
    pending = experts.upload(passes[0][2]) if passes and passes[0][2] else None
    hot_pairs = [(e, s) for r in rounds for e, s in zip(r.experts, r.slots, strict=True) if s < hot]
    out = None
    if hot_pairs:
        out = _pass(x, chosen, weights, spec, experts, hot_pairs, int_x)
    for index, (cold, slots, _) in enumerate(passes):
        if index and passes[index][2]:
            pending = experts.upload(passes[index][2])  # after the previous pass read its slots
        if pending is not None:
            stream.wait_event(pending)
            pending = None
        if cold:
            part = _pass(x, chosen, weights, spec, experts, list(zip(cold, slots, strict=True)), int_x)
            out = part if out is None else out + part
    return out if out is not None else cp.zeros((x.shape[0], experts.slots[2].n_rows), cp.float32)


def _pass(
    x: Any, chosen: Any, weights: Any, spec: MoeSpec, experts: StreamedExperts, placed: list, int_x: bool
) -> Any:
    """The pairs of the experts in `placed` ((expert, slot) pairs); every other pair is skipped."""
    import cupy as cp

    group_of = np.full(spec.num_experts, experts.residency.num_slots, np.int32)  # default: skipped
    for expert, slot in placed:
        group_of[expert] = slot
    groups = cp.asarray(group_of)[chosen]
    gate, up, down = experts.slots
    return moe_experts(x, chosen, weights, spec, gate, up, down, groups, int_x=int_x)
