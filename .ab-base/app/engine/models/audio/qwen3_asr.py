"""Qwen3-ASR's audio encoder and projector over backend ops: log-mel frames -> the text model's
input embeddings, one per `<|audio_pad|>` token.

As transformers' Qwen3ASREncoder: the frames are cut into chunks of 2 * n_window (100) frames, each
convolved on its own by three stride-2 3x3 convolutions with GELU (13 positions per full chunk),
flattened over channels x frequency, projected to d_model and given the sinusoid of its position
in the chunk; the positions inside the clip are kept and packed; a Whisper-style pre-norm encoder
attends within windows of n_window_infer frames' worth of positions (both ways, no mask); a final
LayerNorm; then the projector (linear, GELU, linear). GELU is the exact (erf) form.

Products go through `backend.linear`; the convolutions are products over gathered 3x3 patches.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.engine.embeddings.ops import gelu
from app.engine.images import ImageInput
from app.engine.models.audio.qwen3_asr_config import CONV_LAYERS, Qwen3AsrAudioConfig
from app.engine.models.vision.siglip import LayerNorm, full_attention, named_linear
from app.engine.quant.dispatch import QuantizedTensor

Tensors = dict[str, QuantizedTensor]
POSITIONS = 13  # sinusoids the checkpoint's encoder has: positions in one 100-frame chunk
# Chunks convolved together: bounds the gathered patches (Qwen3-ASR's 480 channels x 9 taps x 800
# positions are 14 MB a chunk in float32 at the second convolution), whatever the clip's length.
CONV_CHUNKS = 32
WINDOW_BATCH = 64  # attention windows computed as one batched product (their scores: windows x heads x w^2)


def conv_length(frames: int) -> int:
    """Positions a run of `frames` mel frames leaves after the three convolutions (0 stays 0)."""
    for _ in range(CONV_LAYERS):
        frames = (frames - 1) // 2 + 1 if frames > 0 else 0
    return frames


def audio_tokens(frames: int, cfg: Qwen3AsrAudioConfig) -> int:
    """Soft tokens for a clip of `frames` mel frames: the positions of its chunks, summed."""
    full, rest = divmod(frames, cfg.chunk_frames)
    return full * conv_length(cfg.chunk_frames) + conv_length(rest)


def sinusoids(length: int, channels: int, max_timescale: float = 10_000.0) -> np.ndarray:
    """Whisper's positional table `[length, channels]`: sines then cosines."""
    increment = np.log(max_timescale) / (channels // 2 - 1)
    inv = np.exp(-increment * np.arange(channels // 2, dtype=np.float32)).astype(np.float32)
    scaled = np.arange(length, dtype=np.float32)[:, None] * inv[None, :]
    return np.concatenate([np.sin(scaled), np.cos(scaled)], axis=1).astype(np.float32)


def window_attention(xp: Any, q: Any, k: Any, v: Any, size: int, scale: float) -> Any:
    """Attention inside consecutive windows of `size` positions, the last one possibly shorter, both
    ways inside a window: `q, k, v [N, heads, d]` -> `[N, heads, d]`. Whole windows go as batched
    products, `WINDOW_BATCH` at a time."""
    n, heads, dim = q.shape
    whole = n // size * size
    parts = []
    for lo in range(0, whole, size * WINDOW_BATCH):
        hi = min(whole, lo + size * WINDOW_BATCH)
        qs, ks, vs = (
            t[lo:hi].astype(xp.float32).reshape(-1, size, heads, dim).transpose(0, 2, 1, 3) for t in (q, k, v)
        )
        scores = xp.matmul(qs, ks.transpose(0, 1, 3, 2))
        scores *= xp.float32(scale)
        scores -= scores.max(axis=-1, keepdims=True)
        xp.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        parts.append(xp.matmul(scores, vs).transpose(0, 2, 1, 3).reshape(hi - lo, heads, dim).astype(q.dtype))
    if whole < n:
        parts.append(full_attention(xp, q[whole:], k[whole:], v[whole:], scale))
    return xp.concatenate(parts, axis=0)


def attention_windows(frames: int, cfg: Qwen3AsrAudioConfig) -> list[int]:
    """Lengths of the packed positions' attention windows, as transformers' `get_audio_cu_seqlens`:
    windows of (the longest chunk's positions x chunks per window), the last one short."""
    chunks = [min(cfg.chunk_frames, frames - s) for s in range(0, frames, cfg.chunk_frames)]
    window = max(audio_tokens(n, cfg) for n in chunks) * (cfg.n_window_infer // cfg.chunk_frames)
    total = audio_tokens(frames, cfg)
    full, rest = divmod(total, window)
    return [window] * full + ([rest] if rest else [])


class Conv3x3:
    """A 3x3 convolution with stride 2 and padding 1 as one product over gathered patches (Gemma 4's
    audio tower takes it too, without a bias)."""

    def __init__(self, backend: Any, tensors: Tensors, name: str) -> None:
        weight = tensors[f"{name}.weight"].dequantize()
        self.xp = backend.xp
        self.weight = backend.from_host(weight.reshape(weight.shape[0], -1).T.copy(), backend.xp.float32)
        bias = tensors.get(f"{name}.bias")
        self.bias = None if bias is None else backend.from_host(bias.dequantize(), backend.xp.float32)

    def __call__(self, x: Any) -> Any:
        """`[N, C, H, W]` -> `[N, out, ceil(H/2), ceil(W/2)]`."""
        xp = self.xp
        n, c, h, w = x.shape
        ho, wo = (h - 1) // 2 + 1, (w - 1) // 2 + 1
        padded = xp.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
        patches = xp.empty((n, ho, wo, c, 9), x.dtype)  # weight order (c, dy, dx); filled once, in place
        for tap in range(9):
            dy, dx = divmod(tap, 3)
            patches[..., tap] = padded[:, :, dy : dy + 2 * ho : 2, dx : dx + 2 * wo : 2].transpose(0, 2, 3, 1)
        out = patches.reshape(n * ho * wo, c * 9) @ self.weight
        if self.bias is not None:
            out += self.bias
        return out.reshape(n, ho, wo, -1).transpose(0, 3, 1, 2)


class _EncoderLayer:
    """Pre-norm: `x + out(attn(ln1(x)))` per window, then `x + fc2(gelu(fc1(ln2(x))))`."""

    def __init__(self, backend: Any, cfg: Qwen3AsrAudioConfig, tensors: Tensors, index: int) -> None:
        p = f"tower.layers.{index}"
        self.backend, self.cfg = backend, cfg
        self.ln1 = LayerNorm(backend, tensors, f"{p}.self_attn_layer_norm", cfg.layer_norm_eps)
        self.ln2 = LayerNorm(backend, tensors, f"{p}.final_layer_norm", cfg.layer_norm_eps)
        parts = [named_linear(backend, tensors, f"{p}.self_attn.{n}_proj") for n in ("q", "k", "v")]
        self.qkv = backend.fuse_linear([x.weight for x in parts], [x.bias for x in parts])
        self.out = named_linear(backend, tensors, f"{p}.self_attn.out_proj")
        self.fc1 = named_linear(backend, tensors, f"{p}.fc1")
        self.fc2 = named_linear(backend, tensors, f"{p}.fc2")

    def __call__(self, x: Any, window: int) -> Any:
        b, c = self.backend, self.cfg
        n = x.shape[0]
        qkv = b.linear(self.ln1(x), self.qkv).reshape(n, 3, c.num_heads, c.head_dim)
        attn = window_attention(b.xp, qkv[:, 0], qkv[:, 1], qkv[:, 2], window, c.head_dim**-0.5)
        x = x + self.out(attn.reshape(n, c.hidden_size))
        return x + self.fc2(gelu(b.xp, self.fc1(self.ln2(x)), "erf"))


class Qwen3AsrAudioEncoder:
    """Log-mel `[mel_bins, frames]` (the clip's frames only) -> audio embeddings `[tokens, output_dim]`.

    Also what the engine's soft-token embedder takes: `encode_image` reads an `ImageInput` whose
    pixel values are the log-mel frames (the soft-token input type images and audio share)."""

    two_way_images = False  # the text model is causal over the audio tokens too

    def __init__(self, backend: Any, cfg: Qwen3AsrAudioConfig, tensors: Tensors) -> None:
        self.backend, self.config = backend, cfg
        self.convs = [Conv3x3(backend, tensors, f"tower.conv2d{i}") for i in (1, 2, 3)]
        self.conv_out = named_linear(backend, tensors, "tower.conv_out")
        self.positions = backend.from_host(sinusoids(POSITIONS, cfg.hidden_size), backend.xp.float32)
        self.layers = [_EncoderLayer(backend, cfg, tensors, i) for i in range(cfg.num_layers)]
        self.ln_post = LayerNorm(backend, tensors, "tower.ln_post", cfg.layer_norm_eps)
        self.linear_1 = named_linear(backend, tensors, "projector.linear_1")
        self.linear_2 = named_linear(backend, tensors, "projector.linear_2")

    def encoder_states(self, mel: np.ndarray) -> Any:
        """The tower's last hidden state `[tokens, d_model]` (before the projector)."""
        b, c = self.backend, self.config
        xp = b.xp
        bins, frames = mel.shape
        if bins != c.num_mel_bins or frames == 0:
            raise ValueError(
                f"log-mel of shape {list(mel.shape)}: the encoder takes [{c.num_mel_bins}, frames > 0]"
            )
        chunks = -(-frames // c.chunk_frames)
        padded = np.zeros((bins, chunks * c.chunk_frames), np.float32)
        padded[:, :frames] = mel
        by_chunk = np.ascontiguousarray(padded.reshape(bins, chunks, c.chunk_frames).transpose(1, 0, 2))
        keep = [conv_length(min(c.chunk_frames, frames - i * c.chunk_frames)) for i in range(chunks)]
        parts = []
        for lo in range(0, chunks, CONV_CHUNKS):
            embedded = self._embed_chunks(by_chunk[lo : lo + CONV_CHUNKS])
            parts += [embedded[i, :n] for i, n in enumerate(keep[lo : lo + CONV_CHUNKS]) if n]
        x = xp.concatenate(parts, axis=0)
        window = attention_windows(frames, c)[0]  # every window but the last is this long
        for layer in self.layers:
            x = layer(x, window)
        return self.ln_post(x)

    def _embed_chunks(self, chunks: np.ndarray) -> Any:
        """`[n, mel_bins, chunk_frames]` -> `[n, positions, d_model]`: convolutions, projection, sinusoids."""
        b = self.backend
        x = b.from_host(chunks[:, None], b.xp.float32)
        for conv in self.convs:
            x = gelu(b.xp, conv(x), "erf")
        n, ch, freq, steps = x.shape
        return self.conv_out(x.transpose(0, 3, 1, 2).reshape(n, steps, ch * freq)) + self.positions[:steps]

    def encode(self, mel: np.ndarray) -> Any:
        return self.linear_2(gelu(self.backend.xp, self.linear_1(self.encoder_states(mel)), "erf"))

    def encode_image(self, audio: ImageInput) -> Any:
        return self.encode(audio.pixel_values)
