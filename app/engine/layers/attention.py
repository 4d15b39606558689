"""Self-attention over the paged KV cache: project, normalise, rotate, cache, attend, project."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.engine.backend.base import AttentionMetadata, RopeTable
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


class Attention:
    def __init__(
        self, backend: Any, tensors: dict[str, QuantizedTensor], prefix: str, spec: AttentionSpec
    ) -> None:
        self.backend = backend
        self.spec = spec
        self.q = Linear(backend, tensors[f"{prefix}.attn_q.weight"], tensors.get(f"{prefix}.attn_q.bias"))
        self.k = Linear(backend, tensors[f"{prefix}.attn_k.weight"], tensors.get(f"{prefix}.attn_k.bias"))
        self.v = Linear(backend, tensors[f"{prefix}.attn_v.weight"], tensors.get(f"{prefix}.attn_v.bias"))
        self.o = Linear(
            backend, tensors[f"{prefix}.attn_output.weight"], tensors.get(f"{prefix}.attn_output.bias")
        )
        self.q_norm = self.k_norm = None
        if spec.qk_norm_eps is not None:
            self.q_norm = RMSNorm(backend, tensors[f"{prefix}.attn_q_norm.weight"], spec.qk_norm_eps)
            self.k_norm = RMSNorm(backend, tensors[f"{prefix}.attn_k_norm.weight"], spec.qk_norm_eps)

    def __call__(self, x: Any, meta: AttentionMetadata, kv_cache: tuple[Any, Any]) -> Any:
        s, b = self.spec, self.backend
        n_tokens = x.shape[0]
        q = self.q(x).reshape(n_tokens, s.num_heads, s.head_dim)
        k = self.k(x).reshape(n_tokens, s.num_kv_heads, s.head_dim)
        v = self.v(x).reshape(n_tokens, s.num_kv_heads, s.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = b.rope(q, meta.positions, s.rope, s.rope_interleaved)
        k = b.rope(k, meta.positions, s.rope, s.rope_interleaved)
        k_cache, v_cache = kv_cache
        b.write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
        out = b.attention(q, k_cache, v_cache, meta, s.scale, s.sliding_window, s.softcap)
        return self.o(out.reshape(n_tokens, s.num_heads * s.head_dim))
