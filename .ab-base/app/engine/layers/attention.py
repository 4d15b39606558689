"""Self-attention over the paged KV cache: project, normalise, rotate, cache, attend, project.

q, k and v are one fused projection (one GEMV launch in decode), which the decoder layer
computes together with the norm in front of it (`RMSNorm.add_norm_linear`) and hands to
`attend`; QK-norm + RoPE + the KV write and the attention after them are one op
(`rope_cache_attention`: one launch on CUDA at decode; elsewhere `rope_and_cache`, itself one
launch on CUDA, then `attention`), which the numpy backend runs as the literal composition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from app.engine.backend.base import AttentionMetadata, Backend, QkvRope, RopeTable
from app.engine.backend.reference_attention import paged_attention
from app.engine.layers.linear import Linear
from app.engine.layers.norm import RMSNorm
from app.engine.loader.names import CheckpointError
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES

F32 = QUANT_TYPES["F32"]


@dataclass(frozen=True)
class AttentionSpec:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    rope: RopeTable
    rope_interleaved: bool
    sliding_window: int | None = None
    softcap: float | None = None
    qk_norm_eps: float | None = None  # set when the checkpoint has per-head q/k norms
    sinks: bool = False  # a learned logit per head in the softmax's denominator (`attn_sinks.weight`)
    # Reads the KV cache another layer writes (Gemma 4's shared-KV layers): q only, no KV write.
    kv_shared: bool = False
    # Values RMS-normalised (no learned scale) before they are cached (Gemma 4).
    value_norm_eps: float | None = None
    # Qwen3.5 / Qwen3-Next: `attn_q` gives each head's query and an output gate side by side
    # ([q_h, gate_h] per head); the attention output is multiplied by sigmoid(gate) before attn_output.
    output_gate: bool = False
    # The output multiplied by a gate from its own projection `attn_gate` of the layer's normed input
    # (fused after q, k, v): softplus per head ("softplus_head") or per element ("softplus") (Laguna),
    # sigmoid per element ("sigmoid") (Muse Glimmer).
    gate_proj: str | None = None
    # Whether the step's image spans attend both ways here (Gemma 4's global layers stay causal).
    image_spans: bool = True


class Attention:
    def __init__(
        self, backend: Backend, tensors: dict[str, QuantizedTensor], prefix: str, spec: AttentionSpec
    ) -> None:
        self.backend = backend
        self.spec = spec
        names = ("attn_q",) if spec.kv_shared else ("attn_q", "attn_k", "attn_v")
        weights = [tensors[f"{prefix}.{n}.weight"] for n in names]
        biases = [tensors.get(f"{prefix}.{n}.bias") for n in names]
        self.gate_cols = 0
        if spec.output_gate:  # the gate rows go last in the fused product, after q, k, v
            if biases[0] is not None:
                raise NotImplementedError(f"{prefix}: a gated query projection with a bias")
            query, gate = split_query_gate(weights[0], spec.num_heads, spec.head_dim)
            weights, biases = [query, *weights[1:], gate], [*biases, None]
            self.gate_cols = spec.num_heads * spec.head_dim
        if spec.gate_proj is not None:
            weights, biases = [*weights, _gate_weight(tensors, prefix, spec)], [*biases, None]
            self.gate_cols = weights[-1].shape[0]
        parts = [Linear(backend, w, b) for w, b in zip(weights, biases, strict=True)]
        self.qkv = backend.fuse_linear([p.weight for p in parts], [p.bias for p in parts])
        self.o = Linear(
            backend, tensors[f"{prefix}.attn_output.weight"], tensors.get(f"{prefix}.attn_output.bias")
        )
        self.q_norm = self.k_norm = None
        if spec.qk_norm_eps is not None:
            self.q_norm = RMSNorm(backend, tensors[f"{prefix}.attn_q_norm.weight"], spec.qk_norm_eps)
            if not spec.kv_shared:
                self.k_norm = RMSNorm(backend, tensors[f"{prefix}.attn_k_norm.weight"], spec.qk_norm_eps)
        norms = (
            (None, None, 0.0)
            if self.q_norm is None
            else (self.q_norm.weight, getattr(self.k_norm, "weight", None), self.q_norm.eps)
        )
        self.value_scale = None  # the unscaled value norm's weight: ones
        if spec.value_norm_eps is not None:
            ones = QuantizedTensor.from_float(f"{prefix}.value_norm", np.ones(spec.head_dim, np.float32), F32)
            self.value_scale = backend.load_weight(ones)
        head_dims = getattr(backend, "attention_head_dims", None)  # where a backend's kernels have a limit
        if head_dims is not None and spec.head_dim not in head_dims:
            raise NotImplementedError(
                f"the {backend.name} backend's attention kernels take head dims {head_dims}; {prefix}'s heads "
                f"are {spec.head_dim} wide: run this model on the CPU backend (--device cpu)"
            )
        self.sinks = None
        if spec.sinks:
            heads = getattr(backend, "sink_head_dims", None)  # where a backend's sinks have a head-dim limit
            if heads is not None and spec.head_dim not in heads:
                raise NotImplementedError(
                    f"the {backend.name} backend's attention with sinks takes head dims {heads}, this model's "
                    f"is {spec.head_dim}; run it on the CPU backend (--device cpu)"
                )
            if not getattr(backend, "supports_attention_sinks", False):
                raise NotImplementedError(
                    f"the {backend.name} backend has no attention with sinks yet (GPT-OSS needs it); "
                    "run this model on the CPU backend (--device cpu)"
                )
            self.sinks = backend.load_weight(tensors[f"{prefix}.attn_sinks.weight"])
        if 2 * spec.rope.cos.shape[-1] < spec.head_dim and not getattr(backend, "supports_partial_rope", False):
            raise NotImplementedError(
                f"the {backend.name} backend has no partial RoPE yet (this model's {prefix} rotates "
                f"{2 * spec.rope.cos.shape[-1]} of {spec.head_dim} dims, as Qwen3.5, Qwen3-Next and Laguna's "
                "full layers do); run this model on the CPU backend (--device cpu)"
            )
        self.rope = QkvRope(
            spec.num_heads, spec.num_kv_heads, spec.head_dim, *norms, spec.rope, spec.rope_interleaved
        )

    def attend(self, qkv: Any, meta: AttentionMetadata, kv_cache: tuple[Any, Any]) -> Any:
        """Everything after the q/k/v projection, from its output `qkv` (the decoder layer
        computes it together with the norm in front of it)."""
        s = self.spec
        k_cache, v_cache = kv_cache
        if s.kv_shared:
            return self.o(
                self._attend_shared(qkv, meta, kv_cache).reshape(qkv.shape[0], s.num_heads * s.head_dim)
            )
        gate = None
        if self.gate_cols:  # read in place by the gate; q/k/v contiguous for the kernels (a copy above one token)
            gate = qkv[:, -self.gate_cols :]
            qkv = self.backend.xp.ascontiguousarray(qkv[:, : -self.gate_cols])
        if self.value_scale is not None:
            qkv = self._normed_values(qkv)
        if meta.image_spans is not None or meta.rope is not None:
            out = self._attend_reference(qkv, meta, kv_cache)  # honours image spans and a step's own rope
        elif self.sinks is None:
            then = self.o.weight if gate is None else None  # the output gate reads float32
            out = self.backend.rope_cache_attention(
                qkv, self.rope, k_cache, v_cache, meta, s.scale, s.sliding_window, s.softcap, then=then
            )
        else:
            r = self.rope
            q = self.backend.rope_and_cache(
                qkv, r.n_heads, r.n_kv_heads, r.head_dim, r.q_norm, r.k_norm, r.eps,
                meta.positions, r.table, r.interleaved, k_cache, v_cache, meta.slot_mapping,
            )  # fmt: skip
            out = self.backend.attention(
                q, k_cache, v_cache, meta, s.scale, s.sliding_window, s.softcap, sinks=self.sinks
            )
        n_tokens = qkv.shape[0]
        out = out.reshape(n_tokens, s.num_heads * s.head_dim)
        if gate is not None:
            out = self._gated(out, gate)
        return self.o(out)

    def _gated(self, out: Any, gate: Any) -> Any:
        """The attention output `[T, heads * dim]` times its gate: sigmoid (Qwen, Muse Glimmer) or softplus
        (Laguna), per element or, for a gate of one column per head, broadcast over each head's dims."""
        kind = "sigmoid" if self.spec.gate_proj in (None, "sigmoid") else "softplus"
        return self.backend.output_gate(out, gate, kind)

    def _normed_values(self, qkv: Any) -> Any:
        """`qkv` with its value columns RMS-normalised per head (no learned scale): Gemma 4's v_norm."""
        s = self.spec
        start = (s.num_heads + s.num_kv_heads) * s.head_dim
        return self.backend.rms_norm_heads(qkv, start, s.num_kv_heads, self.value_scale, s.value_norm_eps)

    def _attend_shared(self, q: Any, meta: AttentionMetadata, kv_cache: tuple[Any, Any]) -> Any:
        """Attention of this layer's queries over the cache an earlier layer of the step wrote (its keys
        and values for the step's tokens are already there): normed, rotated queries, no KV write."""
        s, r, b = self.spec, self.rope, self.backend
        k_cache, v_cache = kv_cache
        q = q.reshape(q.shape[0], s.num_heads, s.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q)
        table, positions = self._rope_rows(meta, q.shape[0])
        q = b.rope(q, positions, table, r.interleaved)
        if meta.image_spans is not None or meta.rope is not None:
            out = paged_attention(
                b.xp, q, k_cache, v_cache, meta, s.scale, s.sliding_window, s.softcap, self._spans(meta)
            )
            return out.astype(q.dtype, copy=False)
        return b.attention(q, k_cache, v_cache, meta, s.scale, s.sliding_window, s.softcap)

    def _rope_rows(self, meta: AttentionMetadata, n_tokens: int) -> tuple[RopeTable, Any]:
        """The table and row of each flat token: the layer's table at its positions, or (M-RoPE) row t of
        the step's own table for flat token t."""
        if meta.rope is not None:
            return meta.rope, self.backend.xp.arange(n_tokens, dtype=self.backend.xp.int32)
        return self.rope.table, meta.positions

    def _attend_reference(self, qkv: Any, meta: AttentionMetadata, kv_cache: tuple[Any, Any]) -> Any:
        s, r, b = self.spec, self.rope, self.backend
        k_cache, v_cache = kv_cache
        table, positions = self._rope_rows(meta, qkv.shape[0])
        q = b.rope_and_cache(
            qkv, r.n_heads, r.n_kv_heads, r.head_dim, r.q_norm, r.k_norm, r.eps,
            positions, table, r.interleaved, k_cache, v_cache, meta.slot_mapping,
        )  # fmt: skip
        out = paged_attention(
            b.xp, q, k_cache, v_cache, meta, s.scale, s.sliding_window, s.softcap, self._spans(meta)
        )
        return out.astype(q.dtype, copy=False)

    def _spans(self, meta: AttentionMetadata) -> Any:
        """The step's two-way image spans where this layer honours them, else none (causal)."""
        return meta.image_spans if self.spec.image_spans else None


def _gate_weight(tensors: dict[str, QuantizedTensor], prefix: str, spec: AttentionSpec) -> QuantizedTensor:
    """The gate's projection `attn_gate [heads or heads * head_dim, hidden]`, checked against its kind."""
    name = f"{prefix}.attn_gate.weight"
    weight = tensors.get(name)
    if weight is None:
        raise CheckpointError(f"tensor {name!r} (the attention output gate) is missing")
    rows = spec.num_heads if spec.gate_proj == "softplus_head" else spec.num_heads * spec.head_dim
    if weight.shape[0] != rows:
        raise CheckpointError(
            f"tensor {name!r} has {weight.shape[0]} rows; a {spec.gate_proj} gate of "
            f"{spec.num_heads} heads of {spec.head_dim} has {rows}"
        )
    return weight


def split_query_gate(
    weight: QuantizedTensor, num_heads: int, head_dim: int
) -> tuple[QuantizedTensor, QuantizedTensor]:
    """A gated `attn_q [heads * 2 * head_dim, hidden]` (per head: query rows, then gate rows) as the
    query rows and the gate rows, each still in the file's format (whole rows are picked)."""
    per_head = np.arange(num_heads)[:, None] * 2 * head_dim + np.arange(head_dim)[None, :]
    query_rows, gate_rows = per_head.reshape(-1), (per_head + head_dim).reshape(-1)
    if weight.shape[0] != 2 * num_heads * head_dim:
        raise CheckpointError(
            f"tensor {weight.name!r} has {weight.shape[0]} rows; a gated query of {num_heads} heads of "
            f"{head_dim} has {2 * num_heads * head_dim}"
        )
    return take_rows(weight, query_rows, f"{weight.name}[query]"), take_rows(
        weight, gate_rows, f"{weight.name}[gate]"
    )


def take_rows(weight: QuantizedTensor, rows: np.ndarray, name: str) -> QuantizedTensor:
    """Rows `rows` of a matrix as a tensor of its own, in the file's format (each row is whole blocks)."""
    if weight.scales is not None:  # a split format's scale grid is per row group: go through floats
        return QuantizedTensor.from_float(name, weight.dequantize(rows), QUANT_TYPES["F32"])
    return QuantizedTensor(
        name, weight.qtype, (len(rows), weight.shape[1]), np.ascontiguousarray(weight.data[rows])
    )
