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

from app.engine.backend.base import AttentionMetadata, Backend, QkvRope, RopeTable
from app.engine.backend.reference_attention import paged_attention
from app.engine.layers.linear import Linear
from app.engine.layers.norm import RMSNorm
from app.engine.quant.dispatch import QuantizedTensor


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


class Attention:
    def __init__(
        self, backend: Backend, tensors: dict[str, QuantizedTensor], prefix: str, spec: AttentionSpec
    ) -> None:
        self.backend = backend
        self.spec = spec
        parts = [Linear(backend, tensors[f"{prefix}.{n}.weight"], tensors.get(f"{prefix}.{n}.bias"))
                 for n in ("attn_q", "attn_k", "attn_v")]  # fmt: skip
        self.qkv = backend.fuse_linear([p.weight for p in parts], [p.bias for p in parts])
        self.o = Linear(
            backend, tensors[f"{prefix}.attn_output.weight"], tensors.get(f"{prefix}.attn_output.bias")
        )
        self.q_norm = self.k_norm = None
        if spec.qk_norm_eps is not None:
            self.q_norm = RMSNorm(backend, tensors[f"{prefix}.attn_q_norm.weight"], spec.qk_norm_eps)
            self.k_norm = RMSNorm(backend, tensors[f"{prefix}.attn_k_norm.weight"], spec.qk_norm_eps)
        norms = (
            (None, None, 0.0)
            if self.q_norm is None
            else (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)
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
        self.rope = QkvRope(
            spec.num_heads, spec.num_kv_heads, spec.head_dim, *norms, spec.rope, spec.rope_interleaved
        )

    def attend(self, qkv: Any, meta: AttentionMetadata, kv_cache: tuple[Any, Any]) -> Any:
        """Everything after the q/k/v projection, from its output `qkv` (the decoder layer
        computes it together with the norm in front of it)."""
        s = self.spec
        k_cache, v_cache = kv_cache
        if meta.image_spans is not None or meta.rope is not None:
            out = self._attend_reference(qkv, meta, kv_cache)  # honours image spans and a step's own rope
        elif self.sinks is None:
            out = self.backend.rope_cache_attention(
                qkv, self.rope, k_cache, v_cache, meta, s.scale, s.sliding_window, s.softcap
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
        return self.o(out.reshape(n_tokens, s.num_heads * s.head_dim))

    def _attend_reference(self, qkv: Any, meta: AttentionMetadata, kv_cache: tuple[Any, Any]) -> Any:
        s, r, b = self.spec, self.rope, self.backend
        k_cache, v_cache = kv_cache
        table, positions = r.table, meta.positions
        if meta.rope is not None:  # M-RoPE: row t of the step's own table rotates flat token t
            table, positions = meta.rope, b.xp.arange(qkv.shape[0], dtype=b.xp.int32)
        q = b.rope_and_cache(
            qkv, r.n_heads, r.n_kv_heads, r.head_dim, r.q_norm, r.k_norm, r.eps,
            positions, table, r.interleaved, k_cache, v_cache, meta.slot_mapping,
        )  # fmt: skip
        out = paged_attention(
            b.xp, q, k_cache, v_cache, meta, s.scale, s.sliding_window, s.softcap, meta.image_spans
        )
        return out.astype(q.dtype, copy=False)
