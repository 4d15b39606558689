"""Granite 3.x (dense): the Llama block with four scalars of its own.

Embeddings are multiplied by `embedding_multiplier`, each sublayer's output by
`residual_multiplier` before it joins the residual stream, attention scores use
`attention_multiplier` instead of 1/sqrt(head_dim), and the logits are divided by
`logits_scaling`. GGUF carries them as `granite.{embedding_scale, residual_scale,
attention.scale, logit_scale}`; llama.cpp's converter permutes q/k as for Llama.
"""

from __future__ import annotations

from typing import Any

from app.engine.models.config import ModelConfig, common_from_gguf, common_from_hf, positive_number
from app.engine.models.family import Family

# GraniteConfig's defaults: a config.json that leaves a multiplier out means these.
_HF_SCALARS = {
    "embedding_scale": ("embedding_multiplier", 1.0),
    "residual_scale": ("residual_multiplier", 1.0),
    "query_scale": ("attention_multiplier", 1.0),
    "logit_scale": ("logits_scaling", 1.0),
}
_GGUF_SCALARS = {
    "embedding_scale": "embedding_scale",
    "residual_scale": "residual_scale",
    "query_scale": "attention.scale",
    "logit_scale": "logit_scale",
}


def scalars_from_gguf(meta: dict[str, Any], arch: str) -> dict[str, float]:
    """The four scalars a Granite GGUF gives (also Granite 4 hybrid's), as ModelConfig fields."""
    scalars = {}
    for field, key in _GGUF_SCALARS.items():
        value = meta.get(f"{arch}.{key}")
        if value is not None:  # llama.cpp treats a missing scalar as 1 (0 for attention: 1/sqrt(d))
            scalars[field] = positive_number(value, f"{arch}.{key}")
    return scalars


def scalars_from_hf(cfg: dict[str, Any]) -> dict[str, float]:
    """The same from config.json, where a missing multiplier means GraniteConfig's default."""
    return {
        field: positive_number(cfg.get(key, default), f"config.json {key}")
        for field, (key, default) in _HF_SCALARS.items()
    }


def config_from_gguf(meta: dict[str, Any], vocab_size: int) -> ModelConfig:
    kwargs = common_from_gguf(meta, vocab_size)
    kwargs.update(scalars_from_gguf(meta, kwargs["architecture"]))
    return ModelConfig(**kwargs, rope_interleaved=True)


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    kwargs = common_from_hf(cfg, "granite")
    text = cfg.get("text_config", cfg)  # Granite Speech keeps the decoder's config there
    kwargs.update(scalars_from_hf(text))
    kwargs["qkv_bias"] = bool(text.get("attention_bias", False))
    return ModelConfig(**kwargs)


FAMILY = Family(
    gguf_arch="granite",
    hf_architectures=("GraniteForCausalLM",),
    config_from_gguf=config_from_gguf,
    config_from_hf=config_from_hf,
)
