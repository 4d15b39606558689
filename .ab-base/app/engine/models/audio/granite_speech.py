"""Granite Speech's audio encoder and projector over backend ops: stacked log-mel frames -> the text
model's input embeddings, one per `<|audio|>` token.

As transformers' GraniteSpeechCTCEncoder: a linear from the 160 stacked mel values to the conformer
width, then conformer blocks, each `x + ff1/2`, `x + attention`, `x + convolution`, `x + ff2/2` and a
LayerNorm. The feed-forwards are pre-norm SiLU MLPs. Attention runs inside blocks of `context_size`
frames (the last block short), with Shaw's relative positions: a learnt vector per distance
`i - j` added to the keys' scores as `q . rel[i - j]` (scaled as the scores are). The convolution module
is pre-norm: a pointwise projection to twice its width, GLU, a depthwise convolution over time (zero
padding, `k // 2` before and `k // 2 - (k + 1) % 2` after), BatchNorm with its running statistics, SiLU
and a pointwise projection back. After the middle block the CTC head's softmax is projected back and
added (self-conditioned CTC).

The projector (GraniteSpeechEncoderProjector) cuts the frames into windows of `window_size` (zero-padded
at the end) and runs a BLIP-2 Q-Former per window: `window_size / downsample_rate` learnt queries,
LayerNormed, then layers of post-norm self-attention among the queries, cross-attention to the window's
frames (every `cross_attention_frequency`-th layer) and a GELU (erf) MLP; a linear maps each query to the
text model's width.

Products go through `backend.linear`; the rest is `backend.xp` in float32.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.engine.embeddings.ops import gelu
from app.engine.images import ImageInput
from app.engine.layers.linear import Linear
from app.engine.models.audio.granite_speech_config import GraniteSpeechAudioConfig
from app.engine.models.vision.siglip import LayerNorm, named_linear
from app.engine.quant.dispatch import QuantizedTensor

Tensors = dict[str, QuantizedTensor]
BLOCK_BATCH = 32  # attention blocks computed as one batched product (their scores: blocks x heads x c^2)


def sigmoid(xp: Any, x: Any) -> Any:
    """`1 / (1 + e^-x)` as `(1 + tanh(x / 2)) / 2`: no overflow for large negative x."""
    return xp.float32(0.5) * (xp.float32(1.0) + xp.tanh(xp.float32(0.5) * x))


def attend(xp: Any, q: Any, k: Any, v: Any, scale: float, bias: Any = None) -> Any:
    """Softmax attention over the last two axes, both ways: `q [..., n, d]`, `k, v [..., m, d]`, an
    optional additive `bias [..., n, m]`."""
    scores = xp.matmul(q, xp.swapaxes(k, -1, -2)) * xp.float32(scale)
    if bias is not None:
        scores = scores + bias
    scores -= scores.max(axis=-1, keepdims=True)
    xp.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return xp.matmul(scores, v)


def pointwise(backend: Any, tensors: Tensors, name: str) -> Linear:
    """A kernel-1 Conv1d `[out, in, 1]` as the linear it is."""
    weight = tensors[f"{name}.weight"]
    out, width = weight.shape[:2]
    flat = QuantizedTensor.from_float(weight.name, weight.dequantize().reshape(out, width), weight.qtype)
    return Linear(backend, flat, tensors.get(f"{name}.bias"))


def batch_norm_affine(tensors: Tensors, prefix: str, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """Inference BatchNorm as `x * scale + shift`: from its running statistics, or as an mmproj stores it
    already folded (`scale`, `shift`)."""
    if f"{prefix}.scale" in tensors:
        return tensors[f"{prefix}.scale"].dequantize(), tensors[f"{prefix}.shift"].dequantize()
    norm = {k: tensors[f"{prefix}.{k}"].dequantize() for k in ("weight", "bias", "running_mean", "running_var")}
    scale = norm["weight"] / np.sqrt(norm["running_var"] + np.float32(eps))
    return scale.astype(np.float32), (norm["bias"] - norm["running_mean"] * scale).astype(np.float32)


class _FeedForward:
    """`down(silu(up(norm(x))))`."""

    def __init__(self, backend: Any, cfg: GraniteSpeechAudioConfig, tensors: Tensors, prefix: str) -> None:
        self.xp = backend.xp
        self.norm = LayerNorm(backend, tensors, f"{prefix}.pre_norm", cfg.layer_norm_eps)
        self.up = named_linear(backend, tensors, f"{prefix}.up_proj")
        self.down = named_linear(backend, tensors, f"{prefix}.down_proj")

    def __call__(self, x: Any) -> Any:
        h = self.up(self.norm(x))
        return self.down(h * sigmoid(self.xp, h))


class _BlockAttention:
    """Attention inside blocks of `context_size` frames with Shaw's relative positions."""

    def __init__(self, backend: Any, cfg: GraniteSpeechAudioConfig, tensors: Tensors, prefix: str) -> None:
        self.backend, self.cfg = backend, cfg
        self.norm = LayerNorm(backend, tensors, f"{prefix}.pre_norm", cfg.layer_norm_eps)
        self.to_q = named_linear(backend, tensors, f"{prefix}.to_q")
        self.to_kv = named_linear(backend, tensors, f"{prefix}.to_kv")
        self.to_out = named_linear(backend, tensors, f"{prefix}.to_out")
        c = cfg.context_size
        # the distances inside a block, -(c - 1)..c - 1 (|i - j| < c <= max_pos_emb: transformers' clamp never
        # bites), as rows of a table; `column[i, j]` is the row of distance i - j
        table = tensors[f"{prefix}.rel_pos_emb.weight"].dequantize()
        self.rel = backend.from_host(table[cfg.max_pos_emb - (c - 1) : cfg.max_pos_emb + c], backend.xp.float32)
        distance = np.arange(c)[:, None] - np.arange(c)[None, :] + (c - 1)
        self.row = backend.from_host(np.arange(c)[:, None].astype(np.int64), backend.xp.int64)
        self.column = backend.from_host(distance.astype(np.int64), backend.xp.int64)

    def __call__(self, x: Any) -> Any:
        b, c = self.backend, self.cfg
        xp, n, size = b.xp, x.shape[0], c.context_size
        h = self.norm(x)
        q = self.to_q(h).reshape(n, c.num_heads, c.head_dim)
        kv = self.to_kv(h).reshape(n, 2, c.num_heads, c.head_dim)
        whole = n // size * size
        parts = []
        for lo in range(0, whole, size * BLOCK_BATCH):
            hi = min(whole, lo + size * BLOCK_BATCH)
            parts.append(self._blocks(q[lo:hi], kv[lo:hi], size))
        if whole < n:  # the short last block: transformers pads it and masks the padding out
            parts.append(self._blocks(q[whole:], kv[whole:], n - whole))
        out = xp.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
        return self.to_out(out.reshape(n, c.num_heads * c.head_dim))

    def _blocks(self, q: Any, kv: Any, size: int) -> Any:
        """Consecutive blocks of `size` frames: `q [blocks * size, heads, d]` -> the same shape."""
        xp, c = self.backend.xp, self.cfg
        heads, dim = c.num_heads, c.head_dim
        qb = q.reshape(-1, size, heads, dim).transpose(0, 2, 1, 3)  # [blocks, heads, size, d]
        kb = kv[:, 0].reshape(-1, size, heads, dim).transpose(0, 2, 1, 3)
        vb = kv[:, 1].reshape(-1, size, heads, dim).transpose(0, 2, 1, 3)
        # q_i . rel[d] for every distance d, then per key j the one of distance i - j
        by_distance = xp.matmul(qb, self.rel.T)  # [blocks, heads, size, 2c - 1]
        positions = by_distance[:, :, self.row[:size], self.column[:size, :size]] * xp.float32(c.head_dim**-0.5)
        out = attend(xp, qb, kb, vb, c.head_dim**-0.5, positions)
        return out.transpose(0, 2, 1, 3).reshape(qb.shape[0] * size, heads, dim)


class _ConvModule:
    """norm, pointwise up to 2 x width, GLU, depthwise conv, BatchNorm, SiLU, pointwise down."""

    def __init__(self, backend: Any, cfg: GraniteSpeechAudioConfig, tensors: Tensors, prefix: str) -> None:
        xp, f32 = backend.xp, backend.xp.float32
        self.xp, self.cfg = xp, cfg
        self.norm = LayerNorm(backend, tensors, f"{prefix}.norm", cfg.layer_norm_eps)
        self.up = pointwise(backend, tensors, f"{prefix}.up_conv")
        self.down = pointwise(backend, tensors, f"{prefix}.down_conv")
        taps = tensors[f"{prefix}.depth_conv.conv.weight"].dequantize()  # [width, 1, k]
        self.taps = backend.from_host(taps[:, 0, :].T.copy(), f32)  # [k, width]
        scale, shift = batch_norm_affine(tensors, f"{prefix}.batch_norm", cfg.batch_norm_eps)
        self.bn_scale, self.bn_shift = backend.from_host(scale, f32), backend.from_host(shift, f32)
        k = cfg.conv_kernel_size
        self.pad = (k // 2, k // 2 - (k + 1) % 2)

    def __call__(self, x: Any) -> Any:
        xp, width = self.xp, self.cfg.conv_size
        u = self.up(self.norm(x))
        glu = u[:, :width] * sigmoid(xp, u[:, width:])
        padded = xp.pad(glu, (self.pad, (0, 0)))
        n = x.shape[0]
        y = padded[0:n] * self.taps[0]
        for tap in range(1, self.taps.shape[0]):
            y += padded[tap : tap + n] * self.taps[tap]
        y = y * self.bn_scale + self.bn_shift
        return self.down(y * sigmoid(xp, y))


class _ConformerBlock:
    def __init__(self, backend: Any, cfg: GraniteSpeechAudioConfig, tensors: Tensors, index: int) -> None:
        p = f"encoder.layers.{index}"
        self.ff1 = _FeedForward(backend, cfg, tensors, f"{p}.ff1")
        self.attn = _BlockAttention(backend, cfg, tensors, f"{p}.attn")
        self.conv = _ConvModule(backend, cfg, tensors, f"{p}.conv")
        self.ff2 = _FeedForward(backend, cfg, tensors, f"{p}.ff2")
        self.post_norm = LayerNorm(backend, tensors, f"{p}.post_norm", cfg.layer_norm_eps)

    def __call__(self, x: Any) -> Any:
        x = x + np.float32(0.5) * self.ff1(x)
        x = x + self.attn(x)
        x = x + self.conv(x)
        x = x + np.float32(0.5) * self.ff2(x)
        return self.post_norm(x)


class _QFormerAttention:
    """BERT-style post-norm attention: `LN(x + dense(attn(x, other)))`."""

    def __init__(self, backend: Any, cfg: GraniteSpeechAudioConfig, tensors: Tensors, prefix: str) -> None:
        self.backend, self.cfg = backend, cfg
        self.query, self.key, self.value = (
            named_linear(backend, tensors, f"{prefix}.attention.{n}") for n in ("query", "key", "value")
        )
        self.dense = named_linear(backend, tensors, f"{prefix}.output.dense")
        self.norm = LayerNorm(backend, tensors, f"{prefix}.output.LayerNorm", cfg.q_layer_norm_eps)

    def __call__(self, x: Any, other: Any) -> Any:
        """`x [windows, queries, hidden]` attending to `other [windows, m, width]` (x itself for self-attention)."""
        c, xp = self.cfg, self.backend.xp
        heads, dim = c.q_heads, c.q_hidden // c.q_heads
        w, n, m = x.shape[0], x.shape[1], other.shape[1]
        q = self.query(x.reshape(w * n, -1)).reshape(w, n, heads, dim).transpose(0, 2, 1, 3)
        flat = other.reshape(w * m, -1)
        k = self.key(flat).reshape(w, m, heads, dim).transpose(0, 2, 1, 3)
        v = self.value(flat).reshape(w, m, heads, dim).transpose(0, 2, 1, 3)
        out = attend(xp, q, k, v, dim**-0.5).transpose(0, 2, 1, 3).reshape(w * n, c.q_hidden)
        return self.norm(self.dense(out).reshape(w, n, c.q_hidden) + x)


class _QFormerLayer:
    def __init__(self, backend: Any, cfg: GraniteSpeechAudioConfig, tensors: Tensors, index: int) -> None:
        p = f"projector.qformer.encoder.layer.{index}"
        self.xp = backend.xp
        self.attention = _QFormerAttention(backend, cfg, tensors, f"{p}.attention")
        self.cross = (
            _QFormerAttention(backend, cfg, tensors, f"{p}.crossattention")
            if index % cfg.q_cross_every == 0
            else None
        )
        self.up = named_linear(backend, tensors, f"{p}.intermediate_query.dense")
        self.down = named_linear(backend, tensors, f"{p}.output_query.dense")
        self.norm = LayerNorm(backend, tensors, f"{p}.output_query.LayerNorm", cfg.q_layer_norm_eps)

    def __call__(self, x: Any, frames: Any) -> Any:
        x = self.attention(x, x)
        if self.cross is not None:
            x = self.cross(x, frames)
        w, n, width = x.shape
        flat = x.reshape(w * n, width)
        return self.norm(self.down(gelu(self.xp, self.up(flat), "erf")) + flat).reshape(w, n, width)


class GraniteSpeechAudioEncoder:
    """Stacked log-mel `[frames, 2 x n_mels]` -> audio embeddings `[tokens, text hidden]`.

    Also what the engine's soft-token embedder takes: `encode_image` reads an `ImageInput` whose pixel
    values are the stacked features (the soft-token input type images and audio share)."""

    two_way_images = False  # the text model is causal over the audio tokens too

    def __init__(self, backend: Any, cfg: GraniteSpeechAudioConfig, tensors: Tensors) -> None:
        self.backend, self.config = backend, cfg
        self.input_linear = named_linear(backend, tensors, "encoder.input_linear")
        self.layers = [_ConformerBlock(backend, cfg, tensors, i) for i in range(cfg.num_layers)]
        self.ctc_out = named_linear(backend, tensors, "encoder.out")
        self.ctc_back = named_linear(backend, tensors, "encoder.out_mid")
        query = tensors["projector.query"].dequantize().reshape(cfg.queries, cfg.q_hidden)
        self.query_norm = LayerNorm(backend, tensors, "projector.qformer.layernorm", cfg.q_layer_norm_eps)
        self.query = backend.from_host(query, backend.xp.float32)
        self.q_layers = [_QFormerLayer(backend, cfg, tensors, i) for i in range(cfg.q_layers)]
        self.linear = named_linear(backend, tensors, "projector.linear")

    def encoder_states(self, features: np.ndarray) -> Any:
        """The conformer's last hidden state `[frames, hidden]` (before the projector)."""
        b, c = self.backend, self.config
        if features.ndim != 2 or features.shape[1] != c.input_dim or features.shape[0] == 0:
            raise ValueError(
                f"features of shape {list(features.shape)}: the encoder takes [frames > 0, {c.input_dim}]"
            )
        x = self.input_linear(b.from_host(np.ascontiguousarray(features, np.float32), b.xp.float32))
        for index, layer in enumerate(self.layers, start=1):
            x = layer(x)
            if index == c.num_layers // 2:  # self-conditioned CTC: the head's distribution fed back
                logits = self.ctc_out(x)
                logits = logits - logits.max(axis=-1, keepdims=True)
                probs = b.xp.exp(logits)
                x = x + self.ctc_back(probs / probs.sum(axis=-1, keepdims=True))
        return x

    def project(self, states: Any) -> Any:
        """The Q-Former over windows of frames: `[frames, hidden]` -> `[windows x queries, text hidden]`."""
        xp, c = self.backend.xp, self.config
        frames = states.shape[0]
        windows = -(-frames // c.window_size)
        padded = xp.zeros((windows * c.window_size, c.hidden_size), xp.float32)
        padded[:frames] = states
        by_window = padded.reshape(windows, c.window_size, c.hidden_size)
        x = xp.broadcast_to(self.query_norm(self.query), (windows, c.queries, c.q_hidden))
        for layer in self.q_layers:
            x = layer(x, by_window)
        return self.linear(xp.ascontiguousarray(x).reshape(windows * c.queries, c.q_hidden))

    def encode(self, features: np.ndarray) -> Any:
        return self.project(self.encoder_states(features))

    def encode_image(self, audio: ImageInput) -> Any:
        """The soft tokens the decoder splices in: scaled as GraniteModel scales every input embedding
        (the decoder scales only token embeddings)."""
        return self.encode(audio.pixel_values) * self.backend.xp.float32(self.config.text_embedding_scale)
