"""Gemma 4's audio tower (Gemma4AudioModel, a USM-style conformer) and its embedder into the text
model, over backend ops: log-mel frames -> one soft token per 4 frames, in the text width.

As transformers 5.24 computes it: two stride-2 3x3 convolutions over (time, mel bins), each followed
by a LayerNorm over channels and ReLU, flattened over (bins, channels) and projected; then conformer
layers, each `ff1 -> attention -> light convolution -> ff2 -> norm`:

- the feed-forwards are half-step residuals (`x + residual_weight * norm(ffn(norm(x)))`, SiLU);
- attention is chunked and local: queries in blocks of `chunk_size`, each block reading a window of
  `context_size` keys around it, logits = content (`q . k`) + relative position (`q . R[distance]`,
  Transformer-XL's shift), tanh-capped, keys outside the clip or the causal window (a query sees
  itself and `context_left - 2` positions back, `context_right - 1` ahead) set to `invalid_logit`;
  queries are scaled per dimension by `softplus(per_dim_scale)`, keys by a constant;
- the light convolution is `linear (2x) -> GLU -> causal depthwise conv -> norm -> SiLU -> linear`;
- every residual branch is clamped to +-gradient_clipping, every projection optionally to its stored
  bounds (clipped linears).

Then `output_proj` (with a bias); the embedder RMS-normalises without a scale and projects to the
text width. Only the clip's valid frames come in (gemma4_audio_features.py): the extractor's padding frames are
zeros the model masks out, so the valid tokens come out the same without them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from app.engine.images import ImageInput
from app.engine.layers.linear import Linear
from app.engine.models.audio.gemma4_audio_config import Gemma4AudioConfig, Tensors
from app.engine.models.audio.qwen3_asr import Conv3x3
from app.engine.models.vision.gemma4_vision import ClippedLinear, Gemma4Norm  # Gemma 4's RMS norm, w or none
from app.engine.models.vision.siglip import gelu_tanh, layer_norm


def _activation(xp: Any, x: Any, kind: str) -> Any:
    if kind in ("silu", "swish"):
        return x / (xp.float32(1.0) + xp.exp(-x))
    if kind == "gelu_pytorch_tanh":
        return gelu_tanh(xp, x)
    from app.engine.embeddings.ops import gelu

    return gelu(xp, x, "erf")


def relative_positions(cfg: Gemma4AudioConfig) -> np.ndarray:
    """Sinusoids `[context_size // 2 + 1, hidden]` (sines then cosines) of distances context_size // 2
    down to 0, as Gemma4AudioRelPositionalEncoding."""
    half = cfg.hidden_size // 2
    increment = math.log(10_000.0) / max(half - 1, 1)
    inv = np.exp(np.arange(half, dtype=np.float32) * np.float32(-increment)).astype(np.float32)
    distances = np.arange(cfg.context_size // 2, -1, -1, dtype=np.float32)[:, None]
    scaled = distances * inv[None, :]
    return np.concatenate([np.sin(scaled), np.cos(scaled)], axis=-1).astype(np.float32)


def block_mask(cfg: Gemma4AudioConfig, tokens: int) -> np.ndarray:
    """`[blocks, chunk, context]` True where a query may read a key: the key inside the clip and
    inside the query's window (transformers' sliding_window_mask_function with (left - 1, right))."""
    blocks = -(-tokens // cfg.chunk_size)
    query = np.arange(blocks)[:, None, None] * cfg.chunk_size + np.arange(cfg.chunk_size)[None, :, None]
    key = (
        np.arange(blocks)[:, None, None] * cfg.chunk_size
        - (cfg.context_left - 1)
        + np.arange(cfg.context_size)
    )
    dist = query - key
    window = ((dist >= 0) & (dist < cfg.context_left - 1)) | ((dist < 0) & (-dist < cfg.context_right))
    return window & (key >= 0) & (key < tokens)


class _Subsampling:
    """`[frames, bins]` -> `[ceil(frames / 4), hidden]`: two conv + LayerNorm + ReLU, then a projection."""

    def __init__(self, backend: Any, cfg: Gemma4AudioConfig, tensors: Tensors) -> None:
        p = "tower.subsample_conv_projection"
        self.backend, self.eps = backend, cfg.rms_norm_eps
        self.convs = [Conv3x3(backend, tensors, f"{p}.layer{i}.conv") for i in (0, 1)]
        self.norms = [backend.from_host(tensors[f"{p}.layer{i}.norm.weight"].dequantize(), backend.xp.float32)
                      for i in (0, 1)]  # fmt: skip
        self.proj = Linear(backend, tensors[f"{p}.input_proj_linear.weight"])

    def __call__(self, mel: np.ndarray) -> Any:
        xp = self.backend.xp
        x = self.backend.from_host(np.ascontiguousarray(mel, np.float32)[None, None], xp.float32)
        for conv, weight in zip(self.convs, self.norms, strict=True):
            y = conv(x).transpose(0, 2, 3, 1)  # [1, time, bins, channels]
            y = xp.maximum(layer_norm(xp, y, weight, xp.float32(0.0), self.eps), xp.float32(0.0))
            x = y.transpose(0, 3, 1, 2)
        _, channels, steps, bins = x.shape
        return self.proj(xp.ascontiguousarray(x[0].transpose(1, 2, 0)).reshape(steps, bins * channels))


class _FeedForward:
    def __init__(self, backend: Any, cfg: Gemma4AudioConfig, tensors: Tensors, prefix: str) -> None:
        self.xp, self.cfg = backend.xp, cfg
        self.up = ClippedLinear(backend, cfg, tensors, f"{prefix}.ffw_layer_1")
        self.down = ClippedLinear(backend, cfg, tensors, f"{prefix}.ffw_layer_2")
        self.pre = Gemma4Norm(
            backend, tensors, f"{prefix}.pre_layer_norm.weight", cfg.hidden_size, cfg.rms_norm_eps
        )
        self.post = Gemma4Norm(
            backend, tensors, f"{prefix}.post_layer_norm.weight", cfg.hidden_size, cfg.rms_norm_eps
        )

    def __call__(self, x: Any) -> Any:
        xp, c = self.xp, self.cfg
        h = self.pre(xp.clip(x, -c.gradient_clipping, c.gradient_clipping))
        h = self.down(_activation(xp, self.up(h), c.activation))
        h = self.post(xp.clip(h, -c.gradient_clipping, c.gradient_clipping))
        return x + h * xp.float32(c.residual_weight)


class _LightConv:
    def __init__(self, backend: Any, cfg: Gemma4AudioConfig, tensors: Tensors, prefix: str) -> None:
        self.xp, self.cfg = backend.xp, cfg
        self.start = ClippedLinear(backend, cfg, tensors, f"{prefix}.linear_start")
        self.end = ClippedLinear(backend, cfg, tensors, f"{prefix}.linear_end")
        kernel = tensors[f"{prefix}.depthwise_conv1d.weight"].dequantize()[:, 0, :]  # [hidden, K]
        self.kernel = backend.from_host(np.ascontiguousarray(kernel.T, np.float32), backend.xp.float32)
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.pre = Gemma4Norm(backend, tensors, f"{prefix}.pre_layer_norm.weight", d, eps)
        self.norm = Gemma4Norm(backend, tensors, f"{prefix}.conv_norm.weight", d, eps)

    def __call__(self, x: Any) -> Any:
        xp, c = self.xp, self.cfg
        h = self.start(self.pre(x))
        a, gate = h[:, : c.hidden_size], h[:, c.hidden_size :]
        h = a / (xp.float32(1.0) + xp.exp(-gate))  # GLU
        taps = self.kernel.shape[0]
        padded = xp.pad(h, ((taps - 1, 0), (0, 0)))  # causal: each position sees itself and K-1 back
        n = h.shape[0]
        conv = sum(padded[j : j + n] * self.kernel[j] for j in range(taps))
        conv = self.norm(xp.clip(conv, -c.gradient_clipping, c.gradient_clipping))
        return x + self.end(_activation(xp, conv, c.activation))


class _Attention:
    def __init__(self, backend: Any, cfg: Gemma4AudioConfig, tensors: Tensors, prefix: str) -> None:
        self.backend, self.cfg = backend, cfg
        self.q, self.k, self.v, self.post = (
            ClippedLinear(backend, cfg, tensors, f"{prefix}.{n}")
            for n in ("q_proj", "k_proj", "v_proj", "post")
        )
        stored = tensors.get(f"{prefix}.softplus_per_dim_scale")  # an mmproj's: softplus already applied
        if stored is None:
            stored_raw = tensors[f"{prefix}.per_dim_scale"].dequantize().astype(np.float32)
            per_dim = np.logaddexp(np.float32(0), stored_raw)  # softplus
        else:
            per_dim = stored.dequantize().astype(np.float32)
        q_scale = np.float32(cfg.head_dim**-0.5 / math.log(2)) * per_dim
        self.q_scale = backend.from_host(q_scale.astype(np.float32), backend.xp.float32)
        self.k_scale = np.float32(math.log(1 + math.e) / math.log(2))
        relative = Linear(backend, tensors[f"{prefix}.relative_k_proj.weight"])
        rel = relative(backend.from_host(relative_positions(cfg), backend.xp.float32))
        self.rel = rel.reshape(-1, cfg.num_heads, cfg.head_dim)  # [P, heads, d]: fixed, so computed once

    def __call__(self, x: Any, mask: Any) -> Any:
        xp, c = self.backend.xp, self.cfg
        n, heads, d, w = x.shape[0], c.num_heads, c.head_dim, c.chunk_size
        blocks, context = mask.shape[0], c.context_size
        q = self.q(x).reshape(n, heads, d) * self.q_scale
        k = self.k(x).reshape(n, heads, d) * self.k_scale
        v = self.v(x).reshape(n, heads, d)
        qb = xp.zeros((blocks * w, heads, d), xp.float32)
        qb[:n] = q
        qb = qb.reshape(blocks, w, heads, d)
        pad = ((c.context_left - 1, c.context_right + w - 1), (0, 0), (0, 0))
        rows = (xp.arange(blocks)[:, None] * w + xp.arange(context)[None, :]).reshape(-1)
        kc = xp.pad(k, pad)[rows].reshape(blocks, context, heads, d)
        vc = xp.pad(v, pad)[rows].reshape(blocks, context, heads, d)
        content = xp.einsum("bwhd,bchd->hbwc", qb, kc)
        position = xp.einsum("bwhd,phd->hbwp", qb, self.rel)  # [heads, blocks, w, P]
        # Transformer-XL's shift: row r of a block reads distance index c - r for key c
        position = xp.pad(position, ((0, 0), (0, 0), (0, 0), (0, context + 1 - position.shape[-1])))
        position = position.reshape(heads, blocks, w * (context + 1))[..., : w * context]
        logits = content + position.reshape(heads, blocks, w, context)
        cap = xp.float32(c.logit_cap)
        logits = xp.tanh(logits / cap) * cap
        logits = xp.where(mask[None], logits, xp.float32(c.invalid_logit))
        logits -= logits.max(axis=-1, keepdims=True)
        probs = xp.exp(logits)
        probs /= probs.sum(axis=-1, keepdims=True)
        out = xp.einsum("hbwc,bchd->bwhd", probs, vc).reshape(blocks * w, heads * d)[:n]
        return self.post(out)


class _ConformerLayer:
    def __init__(self, backend: Any, cfg: Gemma4AudioConfig, tensors: Tensors, index: int) -> None:
        p = f"tower.layers.{index}"
        self.xp, self.cfg = backend.xp, cfg
        self.ff1 = _FeedForward(backend, cfg, tensors, f"{p}.feed_forward1")
        self.ff2 = _FeedForward(backend, cfg, tensors, f"{p}.feed_forward2")
        self.attention = _Attention(backend, cfg, tensors, f"{p}.self_attn")
        self.lconv = _LightConv(backend, cfg, tensors, f"{p}.lconv1d")
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.norm_pre_attn, self.norm_post_attn, self.norm_out = (
            Gemma4Norm(backend, tensors, f"{p}.{n}.weight", d, eps)
            for n in ("norm_pre_attn", "norm_post_attn", "norm_out")
        )

    def __call__(self, x: Any, mask: Any) -> Any:
        xp, clip = self.xp, self.cfg.gradient_clipping
        x = self.ff1(x)
        attn = self.attention(self.norm_pre_attn(xp.clip(x, -clip, clip)), mask)
        x = x + self.norm_post_attn(xp.clip(attn, -clip, clip))
        x = self.ff2(self.lconv(x))
        return self.norm_out(xp.clip(x, -clip, clip))


class Gemma4AudioTower:
    """Log-mel `[frames, bins]` (the clip's valid frames) -> soft tokens `[ceil(frames / 4), text hidden]`.

    Also what the engine's soft-token embedder takes: `encode_image` reads an `ImageInput` whose
    pixel values are the log-mel frames (the soft-token input type images and audio share)."""

    two_way_images = False  # audio tokens stay causal in the text model (only image/video attend both ways)

    def __init__(self, backend: Any, cfg: Gemma4AudioConfig, tensors: Tensors) -> None:
        self.backend, self.config = backend, cfg
        self.subsampling = _Subsampling(backend, cfg, tensors)
        self.layers = [_ConformerLayer(backend, cfg, tensors, i) for i in range(cfg.num_layers)]
        self.output_proj = Linear(
            backend, tensors["tower.output_proj.weight"], tensors["tower.output_proj.bias"]
        )
        self.embed_norm = Gemma4Norm(backend, tensors, None, cfg.output_dim, cfg.rms_norm_eps)
        self.embed_proj = Linear(backend, tensors["embedder.embedding_projection.weight"])

    def tower(self, mel: np.ndarray) -> Any:
        """The tower's output (after `output_proj`, before the embedder) `[tokens, output_dim]`."""
        frames, bins = mel.shape
        if bins != self.config.mel.feature_size or frames == 0:
            raise ValueError(
                f"log-mel of shape {list(mel.shape)}: the audio tower takes [frames > 0, {self.config.mel.feature_size}]"
            )
        x = self.subsampling(mel)
        mask = self.backend.from_host(block_mask(self.config, x.shape[0]))
        for layer in self.layers:
            x = layer(x, mask)
        return self.output_proj(x)

    def encode(self, mel: np.ndarray) -> Any:
        return self.embed_proj(self.embed_norm(self.tower(mel)))

    def encode_image(self, audio: ImageInput) -> Any:
        return self.encode(audio.pixel_values)
