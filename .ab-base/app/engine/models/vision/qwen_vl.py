"""Qwen2.5-VL's vision transformer and patch merger over backend ops.

Patches `[t*h*w, C*T*p*p]` -> patch embedding (the Conv3d over the temporal patch, as one product)
-> blocks of RMSNorm + attention with 2D rotary embeddings (half of each head's frequencies rotate
by the patch's row, half by its column) + RMSNorm + SwiGLU MLP -> the merger (RMSNorm, the 2x2
merge blocks' features side by side, a GELU MLP to the text width): one embedding per merged
patch, in the processor's merge-block order, which is the prompt's order of image tokens.

Attention is windowed except at `fullatt_block_indexes`: the merged grid is cut into windows of
`window_merged` x `window_merged` merged patches (the last ones padded, padding dropped), and the
tower runs with its tokens permuted window by window so that each window is one contiguous run;
the merger's output is permuted back. Full-attention layers attend within each frame.

Tensors keep their Hugging Face names under `visual.` (weights.py's mmproj names are Gemma's; a
Qwen2.5-VL mmproj GGUF is renamed to these by qwen_vl_mmproj.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.engine.embeddings.ops import gelu
from app.engine.images import ImageInput
from app.engine.layers.linear import Linear
from app.engine.layers.norm import RMSNorm
from app.engine.layers.rope import inverse_frequencies
from app.engine.models.vision.qwen_vl_config import QwenVisionConfig
from app.engine.models.vision.siglip import full_attention
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES

Tensors = dict[str, QuantizedTensor]
_F32 = QUANT_TYPES["F32"]


def rotary_positions(grid_thw: tuple[int, int, int], merge: int) -> np.ndarray:
    """`[t*h*w, 2]` (row, column) of each patch, in merge-block order (as the patches come)."""
    t, h, w = grid_thw
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    block = (h // merge, merge, w // merge, merge)
    rows = rows.reshape(block).transpose(0, 2, 1, 3).reshape(-1)
    cols = cols.reshape(block).transpose(0, 2, 1, 3).reshape(-1)
    return np.tile(np.stack([rows, cols], -1), (t, 1))


def window_order(grid_thw: tuple[int, int, int], merge: int, window: int) -> tuple[np.ndarray, list[int]]:
    """The merged patches' order window by window, and the windows' lengths in merged patches
    (empty windows of all-padding left out)."""
    t, h, w = grid_thw[0], grid_thw[1] // merge, grid_thw[2] // merge
    index = np.arange(t * h * w).reshape(t, h, w)
    # the HF code pads by a whole window when a side divides evenly; those windows are empty either way
    pad_h, pad_w = window - h % window, window - w % window
    padded = np.pad(index, ((0, 0), (0, pad_h), (0, pad_w)), constant_values=-1)
    nh, nw = (h + pad_h) // window, (w + pad_w) // window
    windows = padded.reshape(t, nh, window, nw, window).transpose(0, 1, 3, 2, 4).reshape(-1, window * window)
    lengths = (windows >= 0).sum(axis=1)
    order = windows[windows >= 0]
    return order, [int(n) for n in lengths if n]


class VisionBlock:
    """`x + proj(attn(norm1(x)))`, then `x + down(silu(gate(y)) * up(y))` with `y = norm2(x)`."""

    def __init__(self, backend: Any, cfg: QwenVisionConfig, tensors: Tensors, index: int) -> None:
        p = f"blocks.{index}"
        self.backend, self.cfg = backend, cfg
        self.norm1 = RMSNorm(backend, tensors[f"{p}.norm1.weight"], cfg.rms_eps)
        self.norm2 = RMSNorm(backend, tensors[f"{p}.norm2.weight"], cfg.rms_eps)
        self.qkv = _linear(backend, tensors, f"{p}.attn.qkv")
        self.proj = _linear(backend, tensors, f"{p}.attn.proj")
        self.gate, self.up, self.down = (
            _linear(backend, tensors, f"{p}.mlp.{n}_proj") for n in ("gate", "up", "down")
        )

    def __call__(self, x: Any, rope: Any, segments: list[int]) -> Any:
        b, c = self.backend, self.cfg
        n = x.shape[0]
        qkv = self.qkv(self.norm1(x)).reshape(n, 3, c.num_heads, c.head_dim)
        positions = b.xp.arange(n, dtype=b.xp.int32)
        q, k = (b.rope(qkv[:, i], positions, rope, False) for i in (0, 1))
        v = qkv[:, 2]
        parts, start = [], 0
        for length in segments:  # each window (or frame) attends only within itself
            end = start + length
            parts.append(full_attention(b.xp, q[start:end], k[start:end], v[start:end], c.head_dim**-0.5))
            start = end
        x = x + self.proj(b.xp.concatenate(parts).reshape(n, c.hidden_size))
        y = self.norm2(x)
        return x + self.down(b.gated_activation(self.gate(y), self.up(y), "silu"))


def _linear(backend: Any, tensors: Tensors, name: str) -> Linear:
    return Linear(backend, tensors[f"{name}.weight"], tensors.get(f"{name}.bias"))


class QwenVisionTower:
    """Patches + grid -> (tower hidden states `[N, hidden]` in the patches' order, merged
    embeddings `[N / merge^2, out_hidden]`)."""

    def __init__(self, backend: Any, cfg: QwenVisionConfig, tensors: Tensors) -> None:
        self.backend, self.cfg = backend, cfg
        patch = tensors["patch_embed.proj.weight"].dequantize().reshape(cfg.hidden_size, -1)
        if patch.shape[1] != cfg.patch_dim:
            raise ValueError(
                f"visual.patch_embed.proj.weight takes {patch.shape[1]} values a patch, not {cfg.patch_dim}"
            )
        self.patch_embed = Linear(backend, QuantizedTensor.from_float("patch_embed", patch, _F32))
        self.inv_freq = inverse_frequencies(cfg.head_dim // 2, cfg.rope_theta)  # per axis
        self.blocks = [VisionBlock(backend, cfg, tensors, i) for i in range(cfg.depth)]
        self.merger_norm = RMSNorm(backend, tensors["merger.ln_q.weight"], cfg.rms_eps)
        self.merger_fc1 = _linear(backend, tensors, "merger.mlp.0")
        self.merger_fc2 = _linear(backend, tensors, "merger.mlp.2")

    def _rope(self, grid_thw: tuple[int, int, int], order: np.ndarray) -> Any:
        angles = (
            rotary_positions(grid_thw, self.cfg.merge_size)[order].astype(np.float32)[..., None]
            * self.inv_freq
        )
        angles = angles.reshape(len(order), -1)  # row frequencies, then column frequencies
        return self.backend.rope_table(np.cos(angles), np.sin(angles))

    def __call__(self, patches: np.ndarray, grid_thw: tuple[int, int, int]) -> tuple[Any, Any]:
        b, c = self.backend, self.cfg
        t, h, w = grid_thw
        if patches.shape != (t * h * w, c.patch_dim) or h % c.merge_size or w % c.merge_size:
            raise ValueError(
                f"patches {patches.shape} do not fit the grid {grid_thw} of {c.patch_dim}-value patches"
            )
        windows, window_lengths = window_order(grid_thw, c.merge_size, c.window_merged)
        unit = c.merge_unit
        order = (windows[:, None] * unit + np.arange(unit)).reshape(-1)  # patch order, window by window
        x = self.patch_embed(b.from_host(np.ascontiguousarray(patches[order]), b.act_dtype))
        rope = self._rope(grid_thw, order)
        in_windows = [n * unit for n in window_lengths]
        frames = [h * w] * t
        for i, block in enumerate(self.blocks):
            x = block(x, rope, frames if i in c.fullatt_block_indexes else in_windows)
        merged = self.merger_norm(x).reshape(-1, unit * c.hidden_size)
        merged = self.merger_fc2(gelu(b.xp, self.merger_fc1(merged), "erf"))
        back = b.from_host(np.argsort(windows))
        return x[b.from_host(np.argsort(order))], merged[back]


class QwenVisionModel:
    """The tower as the engine's image embedder uses it (worker/images.py)."""

    two_way_images = False  # Qwen2.5-VL's image tokens attend causally in the text model

    def __init__(self, backend: Any, cfg: QwenVisionConfig, tensors: Tensors) -> None:
        self.backend, self.config = backend, cfg
        self.tower = QwenVisionTower(backend, cfg, tensors)

    def encode(self, patches: np.ndarray, grid_thw: tuple[int, int, int]) -> Any:
        """Patches + grid -> image embeddings `[t*h*w / merge^2, text hidden]`."""
        return self.tower(patches, grid_thw)[1]

    def encode_image(self, image: ImageInput) -> Any:
        if image.grid_thw is None:
            raise ValueError("a Qwen2.5-VL image needs its patch grid (ImageInput.grid_thw)")
        return self.encode(image.pixel_values, image.grid_thw)
