"""Gemma 4's vision tower (Gemma4VisionModel) and its embedder into the text model, over backend ops.

Unlike SigLIP it takes a variable patch grid: the processor's patches `[P, 3*p*p]` (values in [0, 1])
with their (x, y) grid positions. Per patch: a linear patch embedding of `2 * (pixels - 0.5)` plus a
learned x- and y-embedding; then encoder blocks with Gemma's sandwich norms, RMS-normed queries and
keys (and values, unscaled), 2D RoPE (the first half of each head rotates by x, the second by y),
unscaled bidirectional attention, and a GELU-gated MLP, every projection optionally clamped
(`use_clipped_linears`); then the grid is average-pooled in k x k cells, scaled by sqrt(hidden),
optionally standardized, RMS-normed (no scale) and projected to the text width.

Padding patches (position (-1, -1)) are dropped before the encoder: transformers masks them out of
every key and zeroes them before pooling, so the real patches' results are the same without them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.engine.images import ImageInput
from app.engine.layers.linear import Linear
from app.engine.models.vision.gemma4_config import Gemma4VisionConfig, Tensors
from app.engine.models.vision.gemma4_processing import grid_positions
from app.engine.models.vision.siglip import full_attention, gelu_tanh


class ClippedLinear:
    """A projection whose input and output are clamped to stored bounds (none where not configured)."""

    def __init__(self, backend: Any, cfg: Gemma4VisionConfig, tensors: Tensors, name: str) -> None:
        self.linear = Linear(backend, tensors[f"{name}.linear.weight"])
        self.xp = backend.xp
        self.bounds: tuple[float, float, float, float] | None = None
        if cfg.clipped_linears:
            parts = ("input_min", "input_max", "output_min", "output_max")
            self.bounds = tuple(float(tensors[f"{name}.{p}"].dequantize().reshape(())) for p in parts)

    def __call__(self, x: Any) -> Any:
        if self.bounds is None:
            return self.linear(x)
        lo, hi, out_lo, out_hi = self.bounds
        return self.xp.clip(self.linear(self.xp.clip(x, lo, hi)), out_lo, out_hi)


class Gemma4Norm:
    """Gemma 4's RMS norm: a plain `w` scale (not `1 + w`), or none."""

    def __init__(self, backend: Any, tensors: Tensors, name: str | None, width: int, eps: float) -> None:
        self.backend, self.eps = backend, eps
        scale = tensors[name].dequantize() if name is not None else np.ones(width, np.float32)
        self.weight = backend.from_host(np.ascontiguousarray(scale, np.float32), backend.xp.float32)

    def __call__(self, x: Any) -> Any:
        return self.backend.rms_norm(x, self.weight, self.eps)


def axial_rope(xp: Any, x: Any, cos: Any, sin: Any) -> Any:
    """Rotate `x [N, heads, d]` by `cos, sin [N, d]`: each half of d is rotated as its own half-split
    RoPE (rotate_half within the half), as apply_multidimensional_rope does for two dimensions."""
    d = x.shape[-1]
    out = xp.empty_like(x)
    for lo in (0, d // 2):
        part, c, s = x[..., lo : lo + d // 2], cos[:, None, lo : lo + d // 2], sin[:, None, lo : lo + d // 2]
        m = d // 4
        rotated = xp.concatenate([-part[..., m:], part[..., :m]], axis=-1)
        out[..., lo : lo + d // 2] = part * c + rotated * s
    return out


def rope_tables(cfg: Gemma4VisionConfig, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin `[N, head_dim]`: x's frequencies over the first half of a head, y's over the second."""
    half = cfg.head_dim // 2
    inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, half, 2, dtype=np.float32) / half))
    angles = positions[..., None].astype(np.float32) * inv_freq.astype(np.float32)  # [N, 2, half/2]
    ax, ay = angles[:, 0], angles[:, 1]
    table = np.concatenate([ax, ax, ay, ay], axis=-1)
    return np.cos(table).astype(np.float32), np.sin(table).astype(np.float32)


class Gemma4EncoderLayer:
    def __init__(self, backend: Any, cfg: Gemma4VisionConfig, tensors: Tensors, index: int) -> None:
        p = f"tower.encoder.layers.{index}"
        self.backend, self.cfg = backend, cfg
        eps, h = cfg.rms_norm_eps, cfg.hidden_size
        lin = {
            n: ClippedLinear(backend, cfg, tensors, f"{p}.self_attn.{n}")
            for n in ("q_proj", "k_proj", "v_proj", "o_proj")
        }
        self.q, self.k, self.v, self.o = lin["q_proj"], lin["k_proj"], lin["v_proj"], lin["o_proj"]
        self.q_norm = Gemma4Norm(backend, tensors, f"{p}.self_attn.q_norm.weight", cfg.head_dim, eps)
        self.k_norm = Gemma4Norm(backend, tensors, f"{p}.self_attn.k_norm.weight", cfg.head_dim, eps)
        self.v_norm = Gemma4Norm(backend, tensors, None, cfg.head_dim, eps)
        self.norms = {
            n: Gemma4Norm(backend, tensors, f"{p}.{n}.weight", h, eps)
            for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                      "post_feedforward_layernorm")
        }  # fmt: skip
        self.gate, self.up, self.down = (
            ClippedLinear(backend, cfg, tensors, f"{p}.mlp.{n}")
            for n in ("gate_proj", "up_proj", "down_proj")
        )

    def __call__(self, x: Any, cos: Any, sin: Any) -> Any:
        xp, c, n = self.backend.xp, self.cfg, x.shape[0]
        h = self.norms["input_layernorm"](x)
        q = axial_rope(xp, self.q_norm(self.q(h).reshape(n, c.num_heads, c.head_dim)), cos, sin)
        k = axial_rope(xp, self.k_norm(self.k(h).reshape(n, c.num_kv_heads, c.head_dim)), cos, sin)
        v = self.v_norm(self.v(h).reshape(n, c.num_kv_heads, c.head_dim))
        group = c.num_heads // c.num_kv_heads
        if group > 1:
            k, v = xp.repeat(k, group, axis=1), xp.repeat(v, group, axis=1)
        attn = full_attention(xp, q, k, v, 1.0)  # the QK norms scale; transformers' scaling is 1
        x = x + self.norms["post_attention_layernorm"](self.o(attn.reshape(n, c.num_heads * c.head_dim)))
        h = self.norms["pre_feedforward_layernorm"](x)
        mlp = self.down(gelu_tanh(xp, self.gate(h)) * self.up(h))
        return x + self.norms["post_feedforward_layernorm"](mlp)


class Gemma4VisionTower:
    """Patches `[P, 3*p*p]` in [0, 1] and positions `[P, 2]` (x, y; padding at -1) -> soft tokens
    `[cells, text hidden]`, one per occupied k x k cell in row-major order."""

    def __init__(self, backend: Any, cfg: Gemma4VisionConfig, tensors: Tensors) -> None:
        self.backend, self.config = backend, cfg
        # the runner's: image tokens attend both ways in the text model (its sliding layers, Gemma 4's
        # decoder config says), else causally
        self.two_way_images = cfg.two_way_images
        f32 = backend.xp.float32
        self.patch_proj = Linear(backend, tensors["tower.patch_embedder.input_proj.weight"])
        table = tensors["tower.patch_embedder.position_embedding_table"].dequantize()
        self.position_table = np.ascontiguousarray(table, np.float32)  # [2, size, hidden], gathered on host
        self.layers = [Gemma4EncoderLayer(backend, cfg, tensors, i) for i in range(cfg.num_layers)]
        self.std: tuple[Any, Any] | None = None
        if cfg.standardize:
            bias, scale = (tensors[f"tower.std_{n}"].dequantize() for n in ("bias", "scale"))
            self.std = (backend.from_host(bias, f32), backend.from_host(scale, f32))
        self.embed_norm = Gemma4Norm(backend, tensors, None, cfg.hidden_size, cfg.rms_norm_eps)
        self.embed_proj = Linear(backend, tensors["embedder.embedding_projection.weight"])

    def encode_image(self, image: ImageInput) -> Any:
        if image.grid_thw is None:
            raise ValueError("a Gemma 4 image needs its patch grid")
        return self.encode(image.pixel_values, grid_positions(image.grid_thw))

    def encode(self, pixel_values: np.ndarray, positions: np.ndarray) -> Any:
        b, c = self.backend, self.config
        real = ~(positions == -1).all(axis=-1)
        pixels, pos = pixel_values[real], positions[real].astype(np.int64)
        check_positions(c, pos)
        embedded = self.position_table[0][pos[:, 0]] + self.position_table[1][pos[:, 1]]
        x = self.patch_proj(
            b.from_host(np.float32(2.0) * (pixels.astype(np.float32) - np.float32(0.5)), b.act_dtype)
        )
        x = x + b.from_host(embedded, b.act_dtype)
        cos, sin = (b.from_host(t, b.act_dtype) for t in rope_tables(c, pos))
        for layer in self.layers:
            x = layer(x, cos, sin)
        pooled = self._pool(x, pos) * b.xp.float32(c.hidden_size**0.5)
        if self.std is not None:
            pooled = (pooled - self.std[0]) * self.std[1]
        return self.embed_proj(self.embed_norm(pooled.astype(b.act_dtype)))

    def _pool(self, x: Any, pos: np.ndarray) -> Any:
        """Average each k x k cell of the grid (cells numbered row-major over the grid's width)."""
        xp, k = self.backend.xp, self.config.pooling_kernel_size
        width, height = int(pos[:, 0].max()) + 1, int(pos[:, 1].max()) + 1
        cells = (pos[:, 0] // k) + (width // k) * (pos[:, 1] // k)
        weights = np.zeros(((width // k) * (height // k), len(pos)), np.float32)
        weights[cells, np.arange(len(pos))] = 1.0 / (k * k)
        return xp.matmul(self.backend.from_host(weights, xp.float32), x.astype(xp.float32))


def check_positions(cfg: Gemma4VisionConfig, pos: np.ndarray) -> None:
    """A full grid whose sides the pooling kernel divides and the position table covers."""
    if len(pos) == 0:
        raise ValueError("the image has no patches")
    k = cfg.pooling_kernel_size
    width, height = int(pos[:, 0].max()) + 1, int(pos[:, 1].max()) + 1
    if pos.min() < 0 or max(width, height) > cfg.position_embedding_size:
        raise ValueError(f"patch positions must lie in 0..{cfg.position_embedding_size - 1}")
    if width % k or height % k or len(pos) != width * height:
        raise ValueError(
            f"a {width}x{height} patch grid ({len(pos)} patches) is not a full grid of {k}x{k} cells"
        )
