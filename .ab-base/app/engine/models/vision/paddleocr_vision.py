"""PaddleOCR-VL's vision tower and projector over backend ops (a NaViT-style SigLIP at the page's
own resolution).

Patches `[h*w, C*p*p]` in raster order -> patch embedding (the stride-p convolution as one product,
with its bias) + the learned position table (a `g x g` grid, bilinearly resized to the image's
`h x w` patch grid exactly as `F.interpolate(align_corners=False)` with edge clamping, what
transformers' `get_vision_interpolation_indices_and_weights` computes) -> SigLIP blocks (LayerNorm,
attention over the whole image with 2D rotary embeddings on q and k: each half of a head's
frequencies split between the patch's row and its column, as Qwen2.5-VL's tower does, then
LayerNorm and a tanh-GELU MLP) -> the post LayerNorm -> the projector: LayerNorm, each 2x2 block of
patches side by side (raster order of blocks: the prompt's order of image tokens), an erf-GELU MLP to
the text width. The tests hold it to transformers within 1e-4.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.engine.embeddings.ops import gelu
from app.engine.images import ImageInput
from app.engine.layers.linear import Linear
from app.engine.layers.rope import inverse_frequencies
from app.engine.models.vision import siglip
from app.engine.models.vision.paddleocr_config import PROJECTOR_NORM_EPS, PaddleVisionConfig
from app.engine.models.vision.qwen_vl import rotary_positions
from app.engine.models.vision.siglip import LayerNorm, full_attention, gelu_tanh, named_linear
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES

Tensors = dict[str, QuantizedTensor]
_F32 = QUANT_TYPES["F32"]


def _axis_taps(size: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Per target index on an axis of `size`, the two source rows of a `side` table and their
    weights (half-pixel centres, taps clamped to the edge)."""
    src = (np.arange(size, dtype=np.float32) + np.float32(0.5)) * np.float32(side) / np.float32(size)
    src = src - np.float32(0.5)
    floor = np.floor(src)
    taps = floor.astype(np.int64)[:, None] + np.arange(2)
    weights = np.clip(1 - np.abs(src[:, None] - floor[:, None] - np.arange(2)), 0, None)
    return np.clip(taps, 0, side - 1), weights.astype(np.float32)


def resized_positions(table: np.ndarray, grid: int, height: int, width: int) -> np.ndarray:
    """`[height*width, hidden]`: the `grid x grid` position table bilinearly resized, raster order."""
    rows, row_w = _axis_taps(height, grid)
    cols, col_w = _axis_taps(width, grid)
    index = (rows[:, None, :, None] * grid + cols[None, :, None, :]).reshape(height * width, 4)
    weight = (row_w[:, None, :, None] * col_w[None, :, None, :]).reshape(height * width, 4)
    return (table[index] * weight[..., None]).sum(axis=1, dtype=np.float32)


class EncoderLayer(siglip.EncoderLayer):
    """SigLIP's block with the 2D rotary embedding on q and k: `x + out(attn(rope(q), rope(k), v))`
    over `ln1(x)`, then `x + fc2(gelu(fc1(ln2(x))))`."""

    def __call__(self, x: Any, rope: Any, positions: Any) -> Any:  # type: ignore[override]
        b, c = self.backend, self.cfg
        n = x.shape[0]
        qkv = b.linear(self.ln1(x), self.qkv).reshape(n, 3, c.num_heads, c.head_dim)
        q, k = (b.rope(qkv[:, i], positions, rope, False) for i in (0, 1))
        attn = full_attention(b.xp, q, k, qkv[:, 2], c.head_dim**-0.5)
        x = x + self.out(attn.reshape(n, c.hidden_size))
        return x + self.fc2(gelu_tanh(b.xp, self.fc1(self.ln2(x))))


class PaddleVisionTower:
    """Patches + grid -> (tower hidden states `[h*w, hidden]`, image embeddings `[h*w/4, text hidden]`)."""

    two_way_images = False  # PaddleOCR-VL's image tokens attend causally in the text model

    def __init__(self, backend: Any, cfg: PaddleVisionConfig, tensors: Tensors) -> None:
        self.backend, self.config = backend, cfg
        flat = tensors["v.patch_embd.weight"].dequantize().reshape(cfg.hidden_size, cfg.patch_dim)
        weight = QuantizedTensor.from_float(
            "v.patch_embd.weight", np.ascontiguousarray(flat, np.float32), _F32
        )
        self.patch_embed = Linear(backend, weight, tensors["v.patch_embd.bias"])
        self.position_table = tensors["v.position_embd.weight"].dequantize().astype(np.float32)
        self.inv_freq = inverse_frequencies(cfg.head_dim // 2, cfg.rope_theta)  # per axis
        self.layers = [EncoderLayer(backend, cfg, tensors, i) for i in range(cfg.num_layers)]
        self.post_norm = LayerNorm(backend, tensors, "v.post_ln", cfg.layer_norm_eps)
        self.merge_norm = LayerNorm(backend, tensors, "mm.input_norm", PROJECTOR_NORM_EPS)
        self.fc1 = named_linear(backend, tensors, "mm.1")
        self.fc2 = named_linear(backend, tensors, "mm.2")

    def _rope(self, grid_thw: tuple[int, int, int]) -> Any:
        angles = rotary_positions(grid_thw, 1).astype(np.float32)[..., None] * self.inv_freq
        angles = angles.reshape(angles.shape[0], -1)  # row frequencies, then column frequencies
        return self.backend.rope_table(np.cos(angles), np.sin(angles))

    def tower(self, patches: np.ndarray, grid_thw: tuple[int, int, int]) -> Any:
        """The blocks' output after the post LayerNorm, `[t*h*w, hidden]` in raster order."""
        b, c = self.backend, self.config
        t, h, w = grid_thw
        if patches.shape != (t * h * w, c.patch_dim) or h % c.merge_size or w % c.merge_size:
            raise ValueError(
                f"patches {patches.shape} do not fit the grid {grid_thw} of {c.patch_dim}-value patches"
            )
        positions = np.tile(resized_positions(self.position_table, c.position_grid, h, w), (t, 1))
        x = self.patch_embed(b.from_host(np.ascontiguousarray(patches, np.float32), b.act_dtype))
        x = x + b.from_host(positions, b.act_dtype)
        rope, index = self._rope(grid_thw), b.xp.arange(t * h * w, dtype=b.xp.int32)
        for layer in self.layers:
            x = layer(x, rope, index)
        return self.post_norm(x)

    def project(self, hidden: Any, grid_thw: tuple[int, int, int]) -> Any:
        """Tower states -> one embedding per 2x2 block of patches, blocks in raster order."""
        b, c = self.backend, self.config
        t, h, w = grid_thw
        m = c.merge_size
        x = self.merge_norm(hidden).reshape(t, h // m, m, w // m, m, c.hidden_size)
        x = x.transpose(0, 1, 3, 2, 4, 5).reshape(t * (h // m) * (w // m), m * m * c.hidden_size)
        return self.fc2(gelu(b.xp, self.fc1(b.xp.ascontiguousarray(x)), "erf"))

    def encode(self, patches: np.ndarray, grid_thw: tuple[int, int, int]) -> Any:
        return self.project(self.tower(patches, grid_thw), grid_thw)

    def encode_image(self, image: ImageInput) -> Any:
        if image.grid_thw is None:
            raise ValueError("a PaddleOCR-VL image needs its patch grid (ImageInput.grid_thw)")
        return self.encode(image.pixel_values, image.grid_thw)
