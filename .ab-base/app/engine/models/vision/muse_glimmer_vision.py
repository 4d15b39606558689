"""Muse Glimmer's vision tower (MuseGlimmerVisionModel), adapter and projection over backend ops.

Patches `[h*w, T*3*p*p]` (row-major; the one frame repeated over the temporal patch) -> a linear patch
embedding (no bias; the temporal halves of its weight summed at load, as llama.cpp's converter does, so it
reads one frame) plus the learned `side x side` position table resampled bilinearly to the grid
(`grid_sample`, half-pixel centres, zero padding; transformers reads it transposed: patch i of an h x w grid
is looked up as row i // h of w rows, column i % h of h) -> ln_pre -> blocks of LayerNorm + attention
(q/k/v with biases, 2D RoPE over the whole head: a quarter of the frequencies by x + 1, a quarter by y + 1,
rotate-half) + LayerNorm + GELU MLP -> ln_post -> the 2x2 pixel shuffle (each merged cell's four patches
side by side, channel-major: feature `c * 4 + s`) -> adapter (fc1, GELU, fc2, GELU) -> projection to the
text width -> RMS norm without a scale at the text model's epsilon. One embedding per merged cell, row-major:
the prompt's order of `<|patch|>` tokens.

Attention is windowed except at `full_attention_layers`: the grid is cut into `side x side`-patch windows
(the last ones padded, padding dropped), and the tower runs with its tokens permuted window by window so
each window is a contiguous run (qwen_vl.window_order, with no merge before the windows).

Tensors keep their Hugging Face names under `tower.` (`model.vision_tower.`), `adapter.` and `projection.`;
muse_glimmer_weights.py reads them from a folder, muse_glimmer_mmproj.py renames an mmproj's to these.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from app.engine.embeddings.ops import gelu
from app.engine.images import ImageInput
from app.engine.layers.linear import Linear
from app.engine.layers.norm import RMSNorm
from app.engine.layers.rope import inverse_frequencies
from app.engine.models.vision.muse_glimmer_config import MuseGlimmerVisionConfig
from app.engine.models.vision.qwen_vl import window_order
from app.engine.models.vision.siglip import LayerNorm, full_attention, named_linear
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES

Tensors = dict[str, QuantizedTensor]
_F32 = QUANT_TYPES["F32"]
BLOCK_NORM_EPS = 1e-5  # MuseGlimmerVisionEncoderLayer builds norm1/norm2 at this eps


def _axis_taps(index: np.ndarray, size: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Bilinear taps (floor, floor + 1) into a `side`-long axis for positions `index` of a `size`-long one,
    half-pixel centres; taps off the table weigh nothing (`padding_mode="zeros"`)."""
    src = (index.astype(np.float64) + 0.5) * side / size - 0.5
    floor = np.floor(src)
    taps = floor[:, None].astype(np.int64) + np.arange(2)
    weights = np.clip(1.0 - np.abs(src[:, None] - taps), 0.0, None)
    weights *= (taps >= 0) & (taps <= side - 1)
    return np.clip(taps, 0, side - 1), weights


def position_embeddings(table: np.ndarray, h: int, w: int) -> np.ndarray:
    """`[h*w, hidden]`: each patch's bilinear mix of the `[side^2, hidden]` position table, read as transformers
    reads it (the grid's sides swapped: `grid_thw[:, [0, 2, 1]]`), one tap at a time (no `[h*w, side^2]` matrix)."""
    side = math.isqrt(table.shape[0])
    flat = np.arange(h * w)
    row_taps, row_weights = _axis_taps(flat // h, w, side)  # as (w rows of h), row-major over the patches
    col_taps, col_weights = _axis_taps(flat % h, h, side)
    out = np.zeros((h * w, table.shape[1]), np.float32)
    for a in range(2):
        for b in range(2):
            weight = (row_weights[:, a] * col_weights[:, b]).astype(np.float32)[:, None]
            out += table[row_taps[:, a] * side + col_taps[:, b]] * weight
    return out


def shuffle_order(h: int, w: int, merge: int) -> np.ndarray:
    """Row-major patches regrouped so each merged cell's `merge x merge` patches are adjacent, cells row-major."""
    return np.arange(h * w).reshape(h // merge, merge, w // merge, merge).transpose(0, 2, 1, 3).reshape(-1)


class MuseGlimmerEncoderLayer:
    """`x + proj(attn(norm1(x)))`, then `x + fc2(gelu(fc1(norm2(x))))`."""

    def __init__(self, backend: Any, cfg: MuseGlimmerVisionConfig, tensors: Tensors, index: int) -> None:
        p = f"tower.layers.{index}"
        self.backend, self.cfg = backend, cfg
        self.norm1 = LayerNorm(backend, tensors, f"{p}.norm1", BLOCK_NORM_EPS)
        self.norm2 = LayerNorm(backend, tensors, f"{p}.norm2", BLOCK_NORM_EPS)
        parts = [named_linear(backend, tensors, f"{p}.attn.{n}_proj") for n in ("q", "k", "v")]
        self.qkv = backend.fuse_linear([x.weight for x in parts], [x.bias for x in parts])
        self.proj = named_linear(backend, tensors, f"{p}.attn.proj")
        self.fc1 = named_linear(backend, tensors, f"{p}.mlp.fc1")
        self.fc2 = named_linear(backend, tensors, f"{p}.mlp.fc2")

    def __call__(self, x: Any, rope: Any, segments: list[int]) -> Any:
        b, c = self.backend, self.cfg
        n = x.shape[0]
        qkv = b.linear(self.norm1(x), self.qkv).reshape(n, 3, c.num_heads, c.head_dim)
        positions = b.xp.arange(n, dtype=b.xp.int32)
        q, k = (b.rope(qkv[:, i], positions, rope, False) for i in (0, 1))
        v = qkv[:, 2]
        parts, start = [], 0
        for length in segments:  # each window (or the whole image) attends only within itself
            end = start + length
            parts.append(full_attention(b.xp, q[start:end], k[start:end], v[start:end], c.head_dim**-0.5))
            start = end
        x = x + self.proj(b.xp.concatenate(parts).reshape(n, c.hidden_size))
        return x + self.fc2(gelu(b.xp, self.fc1(self.norm2(x)), "erf"))


class MuseGlimmerVisionTower:
    """Patches + grid -> image embeddings `[h*w / merge^2, text hidden]`, one per merged cell."""

    two_way_images = False  # Muse Glimmer's image tokens attend causally in the text model

    def __init__(self, backend: Any, cfg: MuseGlimmerVisionConfig, tensors: Tensors) -> None:
        self.backend, self.config = backend, cfg
        patch = tensors["tower.patch_embedder.patch_embedding.weight"]
        if tuple(patch.shape) != (cfg.hidden_size, cfg.frame_dim):
            raise ValueError(f"the patch embedding is {patch.shape}, not ({cfg.hidden_size}, {cfg.frame_dim})")
        self.patch_embed = Linear(backend, patch)
        table = tensors["tower.patch_embedder.position_embedding_table.weight"].dequantize()
        if table.shape != (cfg.position_side**2, cfg.hidden_size):
            raise ValueError(f"the position table is {table.shape}, not ({cfg.position_side**2}, {cfg.hidden_size})")
        self.position_table = np.ascontiguousarray(table, np.float32)  # [side^2, hidden], mixed on the host
        self.ln_pre = LayerNorm(backend, tensors, "tower.ln_pre", cfg.layer_norm_eps)
        self.layers = [MuseGlimmerEncoderLayer(backend, cfg, tensors, i) for i in range(cfg.num_layers)]
        self.ln_post = LayerNorm(backend, tensors, "tower.ln_post", cfg.layer_norm_eps)
        self.inv_freq = inverse_frequencies(cfg.head_dim // 2, cfg.rope_theta)  # per axis
        self.fc1 = Linear(backend, tensors["adapter.fc1.weight"])
        self.fc2 = Linear(backend, tensors["adapter.fc2.weight"])
        self.projection = Linear(backend, tensors["projection.weight"])
        ones = QuantizedTensor.from_float("perception_emb_norm", np.ones(cfg.text_hidden_size, np.float32), _F32)
        self.embed_norm = RMSNorm(backend, ones, cfg.text_rms_eps)

    def _rope(self, h: int, w: int, order: np.ndarray) -> Any:
        rows, cols = np.divmod(order, w)
        positions = np.stack([cols + 1, rows + 1], axis=-1).astype(np.float32)  # (x, y), 1-based
        angles = (positions[..., None] * self.inv_freq).reshape(len(order), -1)  # x frequencies, then y's
        return self.backend.rope_table(np.cos(angles), np.sin(angles))

    def tower(self, patches: np.ndarray, grid_thw: tuple[int, int, int]) -> Any:
        """The tower's merged output `[h*w / merge^2, hidden * merge^2]` (before the adapter)."""
        b, c = self.backend, self.config
        t, h, w = grid_thw
        m = c.merge_size
        if t != 1 or patches.ndim != 2 or patches.shape[0] != h * w or patches.shape[1] % c.frame_dim or h % m or w % m:
            raise ValueError(f"patches {patches.shape} do not fit the grid {grid_thw} of {c.frame_dim}-value frames")
        frame = np.ascontiguousarray(patches[:, : c.frame_dim], np.float32)  # every frame is the same image
        positions = position_embeddings(self.position_table, h, w)
        x = self.patch_embed(b.from_host(frame, b.act_dtype)) + b.from_host(positions, b.act_dtype)
        x = self.ln_pre(x)
        order, windows = window_order(grid_thw, 1, c.position_side)
        x = x[b.from_host(order)]
        rope = self._rope(h, w, order)
        for i, layer in enumerate(self.layers):
            x = layer(x, rope, [h * w] if i in c.full_attention_layers else windows)
        x = self.ln_post(x[b.from_host(np.argsort(order))])
        shuffled = x[b.from_host(shuffle_order(h, w, m))].reshape(-1, c.merge_unit, c.hidden_size)
        return shuffled.transpose(0, 2, 1).reshape(-1, c.hidden_size * c.merge_unit)

    def encode(self, patches: np.ndarray, grid_thw: tuple[int, int, int]) -> Any:
        """Patches + grid -> the image features the text model takes in place of its `<|patch|>` tokens."""
        xp = self.backend.xp
        x = gelu(xp, self.fc1(self.tower(patches, grid_thw)), "erf")
        x = gelu(xp, self.fc2(x), "erf")
        return self.embed_norm(self.projection(x))

    def encode_image(self, image: ImageInput) -> Any:
        if image.grid_thw is None:
            raise ValueError("a Muse Glimmer image needs its patch grid (ImageInput.grid_thw)")
        return self.encode(image.pixel_values, image.grid_thw)
