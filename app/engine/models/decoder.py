"""The decoder-only transformer every supported family shares.

Families differ only in data (ModelConfig flags: QK norm, sandwich norms, biases,
activation, sliding-window layers, scaling) and in checkpoint quirks their own module
absorbs; the forward pass is written once, here, over backend ops.
"""

from __future__ import annotations

from typing import Any

from app.engine.backend.base import AttentionMetadata
from app.engine.layers.attention import Attention, AttentionSpec
from app.engine.layers.embedding import Embedding
from app.engine.layers.linear import Linear
from app.engine.layers.mlp import GatedMLP
from app.engine.layers.moe import MoE
from app.engine.layers.norm import RMSNorm
from app.engine.layers.rope import attention_factor, cos_sin_table, inverse_frequencies, mrope_cos_sin
from app.engine.models.config import ModelConfig
from app.engine.quant.dispatch import QuantizedTensor


class DecoderLayer:
    """Pre-norm block; with `sandwich_norm`, the sublayer outputs are normalised too (Gemma)."""

    def __init__(
        self, backend: Any, cfg: ModelConfig, tensors: dict[str, QuantizedTensor], index: int, spec
    ) -> None:
        prefix = f"blk.{index}"
        eps = cfg.rms_norm_eps
        self.attn_norm = RMSNorm(backend, tensors[f"{prefix}.attn_norm.weight"], eps)
        self.attn = Attention(backend, tensors, prefix, spec)
        self.ffn_norm = RMSNorm(backend, tensors[f"{prefix}.ffn_norm.weight"], eps)
        self.mlp = GatedMLP(backend, tensors, prefix, cfg.activation) if cfg.moe is None else None
        self.moe = MoE(backend, tensors, prefix, cfg.moe) if cfg.moe is not None else None
        self.residual_scale = None if cfg.residual_scale is None else float(cfg.residual_scale)
        self.post_attn_norm = self.post_ffn_norm = None
        if cfg.sandwich_norm:
            self.post_attn_norm = RMSNorm(backend, tensors[f"{prefix}.post_attention_norm.weight"], eps)
            self.post_ffn_norm = RMSNorm(backend, tensors[f"{prefix}.post_ffw_norm.weight"], eps)

    def __call__(self, h: Any, residual: Any | None, meta: AttentionMetadata, kv_cache) -> tuple[Any, Any]:
        """Residual stream value after this layer is `returned_h + returned_residual`."""
        qkv, residual = self.attn_norm.add_norm_linear(h, residual, self.attn.qkv)
        h = self.attn.attend(qkv, meta, kv_cache)
        if self.post_attn_norm is not None:
            h = self.post_attn_norm(h)
        h = self._scaled(h)
        if self.moe is not None:
            normed, residual = self.ffn_norm.add_and_norm(h, residual)
            h = self.moe(normed)
        else:
            act, residual = self.ffn_norm.add_norm_gated_linear(h, residual, self.mlp.gate_up, self.mlp.activation)
            h = self.mlp.down(act)
        if self.post_ffn_norm is not None:
            h = self.post_ffn_norm(h)
        return self._scaled(h), residual

    def _scaled(self, h: Any) -> Any:
        """A sublayer's output as it joins the residual stream (Granite scales it)."""
        return h if self.residual_scale is None else h * h.dtype.type(self.residual_scale)


class DecoderModel:
    def __init__(
        self,
        cfg: ModelConfig,
        tensors: dict[str, QuantizedTensor],
        backend: Any,
        max_positions: int,
        freq_factors: Any = None,
    ) -> None:
        self.config = cfg
        self.backend = backend
        self.embed = Embedding(backend, tensors["token_embd.weight"], cfg.embedding_scale)
        tables = cos_sin_table(
            inverse_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, freq_factors),
            max_positions,
            attention_factor(cfg.rope_scaling),
        )
        global_rope = backend.rope_table(*tables)
        self._host_rope = tables if cfg.mrope_section else None  # M-RoPE gathers its rows per step
        local_rope = global_rope
        if cfg.rope_theta_local is not None:
            local_rope = backend.rope_table(
                *cos_sin_table(inverse_frequencies(cfg.head_dim, cfg.rope_theta_local), max_positions)
            )
        self.layers = []
        for i in range(cfg.num_layers):
            sliding = cfg.is_sliding(i)
            spec = AttentionSpec(
                num_heads=cfg.num_heads,
                num_kv_heads=cfg.num_kv_heads,
                head_dim=cfg.head_dim,
                scale=cfg.attention_scale,
                rope=local_rope if sliding else global_rope,
                rope_interleaved=cfg.rope_interleaved,
                sliding_window=cfg.sliding_window if sliding else None,
                softcap=cfg.attn_softcap,
                qk_norm_eps=cfg.rms_norm_eps if cfg.qk_norm else None,
                sinks=cfg.attention_sinks,
            )
            self.layers.append(DecoderLayer(backend, cfg, tensors, i, spec))
        self.norm = RMSNorm(backend, tensors["output_norm.weight"], cfg.rms_norm_eps)
        output = tensors.get("output.weight")
        if output is None or cfg.tie_word_embeddings:
            embedding = tensors["token_embd.weight"]
            self.lm_head = Linear.sharing(backend, self.embed.weight, embedding.shape)
        else:
            self.lm_head = Linear(backend, output)

    @property
    def syncs_host(self) -> bool:
        """Whether a forward reads back to the host midway (a MoE layer on per-expert products),
        which a CUDA graph capture cannot hold."""
        return any(layer.moe is not None and layer.moe.syncs_host for layer in self.layers)

    def mrope_table(self, positions: Any) -> Any:
        """The step's own RoPE table for 3D position ids `[3, T]` (AttentionMetadata.rope)."""
        cos, sin = self._host_rope
        return self.backend.rope_table(*mrope_cos_sin(cos, sin, positions, self.config.mrope_section))

    def forward(
        self,
        token_ids: Any,
        meta: AttentionMetadata,
        kv_caches: list[tuple[Any, Any]],
        embeds: tuple[Any, Any] | None = None,
    ) -> Any:
        """Final hidden states `[T, hidden]` of the batch's new tokens (KV written as a side effect).

        `embeds = (rows, values)` replaces the embeddings of flat rows `rows` by `values` (an image's
        soft tokens, which are not scaled like token embeddings)."""
        h, residual = self.embed(token_ids), None
        if embeds is not None:
            rows, values = embeds
            h[rows] = values.astype(h.dtype, copy=False)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            h, residual = layer(h, residual, meta, kv_cache)
        normed, _ = self.norm.add_and_norm(h, residual)
        return normed

    def logits(self, hidden: Any) -> Any:
        """Vocabulary logits `[rows, vocab]` for the selected hidden rows."""
        out = self.lm_head(hidden)
        if self.config.logit_scale is not None:
            out = out / out.dtype.type(self.config.logit_scale)
        if self.config.final_softcap is not None:
            out = self.backend.softcap(out, self.config.final_softcap)
        return out
