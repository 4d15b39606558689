"""The SigLIP vision encoder (Gemma 3's tower) over backend ops.

Products go through `backend.linear`, so the weights stay in their checkpoint's format on
either backend; the few ops the text decoder has no use for (LayerNorm with a bias, GELU
without a gate, attention without a mask or a KV cache) are written with `backend.xp`, in
float32, which numpy and CuPy both run as written. Tensors are named as llama.cpp's mmproj
files name them (`v.blk.{i}.attn_q`, ...): `weights.py` maps Hugging Face names onto these.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.engine.layers.linear import Linear
from app.engine.models.vision.config import VisionConfig
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES

_F32 = QUANT_TYPES["F32"]
_GELU_C = float(np.sqrt(2.0 / np.pi))


def layer_norm(xp: Any, x: Any, weight: Any, bias: Any, eps: float) -> Any:
    x32 = x.astype(xp.float32)
    mean = x32.mean(axis=-1, keepdims=True)
    centered = x32 - mean
    var = (centered * centered).mean(axis=-1, keepdims=True)
    return (centered / xp.sqrt(var + xp.float32(eps)) * weight + bias).astype(x.dtype)


def gelu_tanh(xp: Any, x: Any) -> Any:
    """GELU with the tanh approximation (SigLIP's `gelu_pytorch_tanh`)."""
    x32 = x.astype(xp.float32)
    inner = xp.float32(_GELU_C) * (x32 + xp.float32(0.044715) * x32 * x32 * x32)
    return (xp.float32(0.5) * x32 * (xp.float32(1.0) + xp.tanh(inner))).astype(x.dtype)


def full_attention(xp: Any, q: Any, k: Any, v: Any, scale: float) -> Any:
    """Every patch attends to every patch of its image: `q, k, v [N, heads, d]` -> `[N, heads, d]`.

    One head at a time: Gemma 3's 4,096 patches make a head's score matrix 64 MiB in float32, all 16
    heads at once 1 GiB (and as much again for the probabilities) per image."""
    qh, kh, vh = (t.astype(xp.float32).transpose(1, 0, 2) for t in (q, k, v))  # [heads, N, d]
    out = xp.empty_like(qh)
    for h in range(qh.shape[0]):
        scores = xp.matmul(qh[h], kh[h].T)
        scores *= xp.float32(scale)
        scores -= scores.max(axis=-1, keepdims=True)
        xp.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        out[h] = xp.matmul(scores, vh[h])
    return out.transpose(1, 0, 2).astype(q.dtype)


class LayerNorm:
    """LayerNorm with a bias over float32 weights (SigLIP's; Qwen3-ASR's audio encoder takes it too)."""

    def __init__(self, backend: Any, tensors: dict[str, QuantizedTensor], name: str, eps: float) -> None:
        f32 = backend.xp.float32
        self.xp = backend.xp
        self.weight = backend.from_host(tensors[f"{name}.weight"].dequantize(), f32)
        self.bias = backend.from_host(tensors[f"{name}.bias"].dequantize(), f32)
        self.eps = eps

    def __call__(self, x: Any) -> Any:
        return layer_norm(self.xp, x, self.weight, self.bias, self.eps)


def named_linear(backend: Any, tensors: dict[str, QuantizedTensor], name: str) -> Linear:
    return Linear(backend, tensors[f"{name}.weight"], tensors.get(f"{name}.bias"))


class EncoderLayer:
    """Pre-norm block: `x + attn(ln1(x))`, then `x + fc2(gelu(fc1(ln2(x))))`."""

    def __init__(self, backend: Any, cfg: VisionConfig, tensors: dict[str, QuantizedTensor], index: int):
        p = f"v.blk.{index}"
        self.backend, self.cfg = backend, cfg
        self.ln1 = LayerNorm(backend, tensors, f"{p}.ln1", cfg.layer_norm_eps)
        self.ln2 = LayerNorm(backend, tensors, f"{p}.ln2", cfg.layer_norm_eps)
        parts = [named_linear(backend, tensors, f"{p}.attn_{n}") for n in ("q", "k", "v")]
        self.qkv = backend.fuse_linear([x.weight for x in parts], [x.bias for x in parts])
        self.out = named_linear(backend, tensors, f"{p}.attn_out")
        self.fc1 = named_linear(backend, tensors, f"{p}.ffn_up")
        self.fc2 = named_linear(backend, tensors, f"{p}.ffn_down")

    def __call__(self, x: Any) -> Any:
        b, c = self.backend, self.cfg
        n = x.shape[0]
        qkv = b.linear(self.ln1(x), self.qkv).reshape(n, 3, c.num_heads, c.head_dim)
        attn = full_attention(b.xp, qkv[:, 0], qkv[:, 1], qkv[:, 2], c.head_dim**-0.5)
        x = x + self.out(attn.reshape(n, c.hidden_size))
        return x + self.fc2(gelu_tanh(b.xp, self.fc1(self.ln2(x))))


class SiglipEncoder:
    """Pixel values `[3, S, S]` (normalized) -> patch features `[(S/p)^2, hidden]`."""

    def __init__(self, backend: Any, cfg: VisionConfig, tensors: dict[str, QuantizedTensor]) -> None:
        self.backend, self.cfg = backend, cfg
        patch = tensors["v.patch_embd.weight"]
        flat = patch.dequantize().reshape(cfg.hidden_size, -1)  # the conv as a product over (c, y, x)
        f32 = QuantizedTensor.from_float("v.patch_embd.weight", flat, _F32)
        self.patch_embed = Linear(backend, f32, tensors["v.patch_embd.bias"])
        self.positions = backend.from_host(tensors["v.position_embd.weight"].dequantize(), backend.act_dtype)
        self.layers = [EncoderLayer(backend, cfg, tensors, i) for i in range(cfg.num_layers)]
        self.post_norm = LayerNorm(backend, tensors, "v.post_ln", cfg.layer_norm_eps)

    def __call__(self, pixels: np.ndarray) -> Any:
        b, c = self.backend, self.cfg
        x = self.patch_embed(b.from_host(patchify(pixels, c.patch_size), b.act_dtype)) + self.positions
        for layer in self.layers:
            x = layer(x)
        return self.post_norm(x)


def patchify(pixels: np.ndarray, patch: int) -> np.ndarray:
    """`[C, H, W]` -> `[(H/p)*(W/p), C*p*p]`, patches in row-major order, each flattened as (c, y, x)
    (the order of a stride-p convolution's weight `[out, C, p, p]`)."""
    ch, h, w = pixels.shape
    grid = pixels.reshape(ch, h // patch, patch, w // patch, patch)
    return np.ascontiguousarray(grid.transpose(1, 3, 0, 2, 4).reshape((h // patch) * (w // patch), -1))
