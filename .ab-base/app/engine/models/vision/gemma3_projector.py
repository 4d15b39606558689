"""Gemma 3's multimodal projector: SigLIP's patch grid average-pooled to `tokens_per_image`
soft tokens, RMS-normalized (stored as `1 + w`, as GGUF and the engine keep Gemma norms), then
projected to the text model's width. The products run through backend ops."""

from __future__ import annotations

from typing import Any

from app.engine.layers.linear import Linear
from app.engine.layers.norm import RMSNorm
from app.engine.models.vision.config import VisionConfig
from app.engine.quant.dispatch import QuantizedTensor


class Gemma3Projector:
    def __init__(self, backend: Any, cfg: VisionConfig, tensors: dict[str, QuantizedTensor]) -> None:
        self.backend, self.cfg = backend, cfg
        self.norm = RMSNorm(backend, tensors["mm.soft_emb_norm.weight"], cfg.layer_norm_eps)
        self.proj = Linear(backend, tensors["mm.input_projection.weight"])  # [text hidden, vision hidden]

    def __call__(self, features: Any) -> Any:
        """`[patches_per_side^2, vision hidden]` -> `[tokens_per_image, text hidden]`."""
        c = self.cfg
        side, k = c.patches_per_side, c.pool_kernel
        grid = features.reshape(side // k, k, side // k, k, c.hidden_size)
        pooled = grid.mean(axis=(1, 3)).reshape(c.tokens_per_image, c.hidden_size)
        return self.proj(self.norm(pooled.astype(features.dtype)))
