"""The decoder-only transformer every supported family shares.

Families differ only in data (ModelConfig flags: QK norm, sandwich norms, biases,
activation, sliding-window layers, scaling) and in checkpoint quirks their own module
absorbs; the forward pass is written once, here, over backend ops.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.engine.backend.base import AttentionMetadata, RopeTable
from app.engine.layers.attention import Attention, AttentionSpec
from app.engine.layers.embedding import Embedding
from app.engine.layers.linear import Linear
from app.engine.layers.mlp import dense_mlp
from app.engine.layers.moe import MoE
from app.engine.layers.moe_beside import ExpertsBesideMlp
from app.engine.layers.norm import RMSNorm
from app.engine.layers.per_layer_input import LayerInputGate, PerLayerInputs
from app.engine.layers.rope import (
    attention_factor,
    cos_sin_table,
    identity_table,
    inverse_frequencies,
    mrope_cos_sin,
)
from app.engine.models.config import (
    FFN_DENSE,
    FFN_MOE,
    FFN_NONE,
    MIXER_ATTENTION,
    MIXER_GATED_DELTANET,
    MIXER_MAMBA2,
    MIXER_NONE,
    RECURRENT_MIXERS,
    ModelConfig,
)
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES

F32 = QUANT_TYPES["F32"]


class DecoderLayer:
    """Pre-norm block: a token mixer, then a feed-forward, each behind its own norm and folded into
    the residual stream; with `sandwich_norm`, the sublayer outputs are normalised too (Gemma).

    The mixer is attention over the paged KV cache, or (hybrid models) a recurrent layer whose
    cache entry is its state arrays `[num_slots, ...]` (layers/gated_deltanet.py, layers/mamba2.py);
    a layer may lack either part (Nemotron-H's MLP-only and mixer-only layers)."""

    def __init__(
        self, backend: Any, cfg: ModelConfig, tensors: dict[str, QuantizedTensor], index: int, spec
    ) -> None:
        prefix = f"blk.{index}"
        eps = cfg.rms_norm_eps
        self.mixer_kind, self.ffn_kind = cfg.mixer(index), cfg.ffn(index)
        self.attn_norm = self.attn = self.recurrent = None
        if self.mixer_kind != MIXER_NONE:
            self.attn_norm = RMSNorm(backend, tensors[f"{prefix}.attn_norm.weight"], eps)
        if self.mixer_kind == MIXER_ATTENTION:
            self.attn = Attention(backend, tensors, prefix, spec)
        elif self.mixer_kind in RECURRENT_MIXERS:
            self.recurrent = recurrent_mixer(backend, cfg, tensors, prefix, self.mixer_kind)
        self.ffn_norm = self.mlp = self.moe = None
        if self.ffn_kind != FFN_NONE:
            self.ffn_norm = RMSNorm(backend, tensors[f"{prefix}.ffn_norm.weight"], eps)
        if self.ffn_kind == FFN_DENSE:
            self.mlp = dense_mlp(backend, tensors, prefix, cfg.activation)
        elif self.ffn_kind == FFN_MOE:
            assert cfg.moe is not None
            self.moe = MoE(backend, tensors, prefix, cfg.moe)
        self.residual_scale = None if cfg.residual_scale is None else float(cfg.residual_scale)
        self.post_attn_norm = self.post_ffn_norm = None
        if cfg.sandwich_norm:
            post_eps = eps if cfg.post_norm_eps is None else cfg.post_norm_eps
            self.post_attn_norm = RMSNorm(backend, tensors[f"{prefix}.post_attention_norm.weight"], post_eps)
            self.post_ffn_norm = RMSNorm(backend, tensors[f"{prefix}.post_ffw_norm.weight"], post_eps)
        # Gemma 4: experts beside the MLP, the per-layer input, a scalar on the layer's output stream
        self.experts_beside = ExpertsBesideMlp(backend, cfg, tensors, prefix) if cfg.moe_beside_mlp else None
        self.input_gate = LayerInputGate(backend, tensors, prefix, eps) if cfg.per_layer_input_size else None
        self.output_scale = None
        if cfg.layer_output_scale:
            self.output_scale = backend.load_weight(tensors[f"{prefix}.layer_output_scale.weight"])
        # A post-norm whose output joins the stream and is scaled with it, nothing in between: one op
        self._joins_in_one_launch = (
            self.post_ffn_norm is not None and self.output_scale is not None
            and self.input_gate is None and self.residual_scale is None
        )  # fmt: skip

    def __call__(
        self, h: Any, residual: Any | None, meta: AttentionMetadata, cache: Any, layer_input: Any = None
    ) -> tuple[Any, Any]:
        """Residual stream value after this layer is `returned_h + returned_residual`. `cache` is the
        layer's (K, V) for attention (another layer's, for a shared-KV layer), its state arrays for a
        recurrent mixer, None for neither; `layer_input`: its per-layer input `[T, size]` (PLE)."""
        if self.attn is not None:
            qkv, residual = self.attn_norm.add_norm_linear(h, residual, self.attn.qkv)
            h = self.attn.attend(qkv, meta, cache)
        elif self.recurrent is not None:
            normed, residual = self.attn_norm.add_and_norm(h, residual)
            h = self.recurrent(normed, meta, cache)
        if self.mixer_kind != MIXER_NONE:
            if self.post_attn_norm is not None:
                h = self.post_attn_norm(h)
            h = self._scaled(h)
        if self.ffn_kind == FFN_NONE:
            return h, residual
        if self.moe is not None or not self.mlp.gated:  # experts, or a plain up/down MLP (Nemotron-H)
            normed, residual = self.ffn_norm.add_and_norm(h, residual)
            h = self.moe(normed) if self.moe is not None else self.mlp(normed)
        else:
            act, residual = self.ffn_norm.add_norm_gated_linear(
                h, residual, self.mlp.gate_up, self.mlp.activation, then=self.mlp.down.weight
            )
            h = self.mlp.down(act)
            if self.experts_beside is not None:
                h = self.experts_beside(h, residual)
        if self._joins_in_one_launch:  # Gemma 4's post-norm, residual add and layer scale
            return self.post_ffn_norm.join(h, residual, self.output_scale), None
        if self.post_ffn_norm is not None:
            h = self.post_ffn_norm(h)
        h = self._scaled(h)
        if self.input_gate is None and self.output_scale is None:
            return h, residual
        stream = h + residual
        if self.input_gate is not None:
            stream = self.input_gate(stream, layer_input)
        if self.output_scale is not None:
            stream = stream * self.output_scale
        return stream, None

    def _scaled(self, h: Any) -> Any:
        """A sublayer's output as it joins the residual stream (Granite scales it)."""
        return h if self.residual_scale is None else h * h.dtype.type(self.residual_scale)


def recurrent_mixer(
    backend: Any, cfg: ModelConfig, tensors: dict[str, QuantizedTensor], prefix: str, kind: str
) -> Any:
    """The recurrent token mixer `kind` (one of RECURRENT_MIXERS) of the layer whose tensors are under `prefix`."""
    if kind == MIXER_GATED_DELTANET:
        from app.engine.layers.gated_deltanet import GatedDeltaNet

        assert cfg.gated_deltanet is not None
        return GatedDeltaNet(backend, tensors, prefix, cfg.gated_deltanet, cfg.rms_norm_eps)
    if kind == MIXER_MAMBA2:
        from app.engine.layers.mamba2 import Mamba2

        assert cfg.mamba2 is not None
        return Mamba2(backend, tensors, prefix, cfg.mamba2, cfg.rms_norm_eps)
    raise ValueError(f"{prefix}: unknown recurrent mixer {kind!r}")


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
        self._max_positions, self._freq_factors = max_positions, freq_factors
        self._rope_tables: dict[tuple[int, bool, bool], RopeTable] = {}
        # M-RoPE gathers its rows per step from the host tables
        self._host_rope = self._host_tables(cfg.head_dim, local=False) if cfg.mrope_section else None
        self.layers = []
        for i in range(cfg.num_layers):
            sliding = cfg.is_sliding(i)
            spec = AttentionSpec(
                num_heads=cfg.heads_of(i),
                num_kv_heads=cfg.kv_heads_of(i),
                head_dim=cfg.head_dim_of(i),
                scale=cfg.attention_scale,
                rope=self._rope(
                    cfg.head_dim_of(i),
                    local=sliding and cfg.rope_theta_local is not None,
                    nope=cfg.is_nope(i),
                ),
                rope_interleaved=cfg.rope_interleaved,
                sliding_window=cfg.sliding_window if sliding else None,
                softcap=cfg.attn_softcap,
                qk_norm_eps=cfg.rms_norm_eps if cfg.qk_norm else None,
                sinks=cfg.attention_sinks,
                kv_shared=cfg.kv_source(i) != i,
                value_norm_eps=cfg.rms_norm_eps if cfg.value_norm else None,
                output_gate=cfg.attn_output_gate,
                gate_proj=cfg.gate_proj,
                image_spans=sliding or not cfg.image_spans_sliding_only,
            )
            self.layers.append(DecoderLayer(backend, cfg, tensors, i, spec))
        self.per_layer_inputs = None
        if cfg.per_layer_input_size:
            self.per_layer_inputs = PerLayerInputs(
                backend,
                tensors,
                cfg.num_layers,
                cfg.per_layer_input_size,
                cfg.rms_norm_eps,
                cfg.per_layer_pad_id,
            )
        self.norm = RMSNorm(backend, tensors["output_norm.weight"], cfg.rms_norm_eps)
        self.embed_norm = None  # Muse Glimmer: the embeddings RMS-normalised, no scale
        if cfg.embedding_norm:
            ones = np.ones(cfg.hidden_size, np.float32)
            self.embed_norm = RMSNorm(
                backend, QuantizedTensor.from_float("embed_norm", ones, F32), cfg.rms_norm_eps
            )
        output = tensors.get("output.weight")
        if output is None or cfg.tie_word_embeddings:
            embedding = tensors["token_embd.weight"]
            self.lm_head = Linear.sharing(backend, self.embed.weight, embedding.shape)
        else:
            self.lm_head = Linear(backend, output)

    def _host_tables(self, head_dim: int, local: bool, nope: bool = False) -> tuple[Any, Any]:
        """cos/sin tables for heads of `head_dim`: the sliding layers' own base (`local`), or the global
        base with its scaling, the checkpoint's frequency factors and proportional RoPE (Gemma 4); for
        a NoPE layer (`nope`) every angle is 0 (cos 1, sin 0), which turns q and k by nothing, exactly."""
        cfg = self.config
        if nope:  # one identity row, broadcast: no memory however many positions (a NoPE GGUF says 2^20)
            return identity_table(head_dim // 2, self._max_positions)
        if local:
            assert cfg.rope_theta_local is not None
            return cos_sin_table(inverse_frequencies(head_dim, cfg.rope_theta_local), self._max_positions)
        # partial RoPE (Qwen3.5, Qwen3-Next): the frequencies of the rotated dims only
        rotated = cfg.rotary_dim or head_dim
        inverse = inverse_frequencies(rotated, cfg.rope_theta, cfg.rope_scaling, self._freq_factors)
        if cfg.global_rope_fraction is not None:  # the pairs past the rotated share keep frequency 0
            inverse = inverse.copy()
            inverse[int(cfg.global_rope_fraction * head_dim // 2) :] = 0.0
        return cos_sin_table(inverse, self._max_positions, attention_factor(cfg.rope_scaling))

    def _rope(self, head_dim: int, local: bool, nope: bool = False) -> RopeTable:
        key = (head_dim, local, nope)
        if key not in self._rope_tables:
            self._rope_tables[key] = self.backend.rope_table(*self._host_tables(head_dim, local, nope))
        return self._rope_tables[key]

    @property
    def syncs_host(self) -> bool:
        """Whether a forward reads back to the host midway (a MoE layer on per-expert products, recurrent
        mixers on a backend whose recurrent ops walk the batch's sequences on the host), which a CUDA graph
        capture cannot hold. Both recurrent mixers (Mamba-2, Gated DeltaNet) are written over the backend's
        recurrent ops (`causal_conv1d`, `ssd_scan`, `gated_delta_net_rule`, ...): its
        `recurrent_syncs_host` answers for them."""
        experts = [layer.moe for layer in self.layers] + [layer.experts_beside for layer in self.layers]
        recurrent = any(layer.recurrent is not None for layer in self.layers)
        return any(e is not None and e.syncs_host for e in experts) or (
            recurrent and getattr(self.backend, "recurrent_syncs_host", True)
        )

    def state_shapes(self) -> list[tuple[tuple[int, ...], ...] | None]:
        """Per layer, the per-sequence recurrent state shapes (float32) the runner allocates a slot
        array for, `[num_slots, *shape]` each; None for layers whose cache is (K, V) or nothing."""
        return [self.config.state_shapes(i) for i in range(self.config.num_layers)]

    def mrope_table(self, positions: Any) -> Any:
        """The step's own RoPE table for 3D position ids `[3, T]` (AttentionMetadata.rope)."""
        cos, sin = self._host_rope
        return self.backend.rope_table(*mrope_cos_sin(cos, sin, positions, self.config.mrope_section))

    def forward(
        self,
        token_ids: Any,
        meta: AttentionMetadata,
        kv_caches: list[Any],
        embeds: tuple[Any, Any] | None = None,
    ) -> Any:
        """Final hidden states `[T, hidden]` of the batch's new tokens (KV and recurrent states
        written as a side effect). `kv_caches[i]` is layer i's cache: (K, V) for attention, the
        state arrays for a recurrent mixer (`state_shapes`), None for a layer with neither.

        `embeds = (rows, values)` replaces the embeddings of flat rows `rows` by `values` (an image's
        soft tokens, which are not scaled like token embeddings); per-layer inputs are computed after
        that, as transformers does (the soft token projected, the pad token's own embedding)."""
        h, residual = self.embed(token_ids), None
        if self.embed_norm is not None:
            h = self.embed_norm(h)
        soft_rows = None
        if embeds is not None:
            soft_rows, values = embeds
            h[soft_rows] = values.astype(h.dtype, copy=False)
        layer_inputs = None
        if self.per_layer_inputs is not None:
            layer_inputs = self.per_layer_inputs(token_ids, h, soft_rows)
        for i, (layer, cache) in enumerate(zip(self.layers, kv_caches, strict=True)):
            h, residual = layer(
                h, residual, meta, cache, None if layer_inputs is None else layer_inputs[:, i]
            )
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
