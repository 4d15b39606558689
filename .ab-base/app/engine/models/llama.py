"""Llama (2, 3.x): the plain pre-norm decoder with SwiGLU and grouped-query attention.

llama.cpp's converter permutes q/k rows so GGUF files rotate adjacent pairs; Hugging
Face files rotate halves. Llama 3.1's frequency scaling arrives as `rope_freqs.weight`
in GGUF and as `rope_scaling` in config.json.
"""

from __future__ import annotations

from typing import Any

from app.engine.models.config import ModelConfig, common_from_gguf, common_from_hf
from app.engine.models.family import Family


def config_from_gguf(meta: dict[str, Any], vocab_size: int) -> ModelConfig:
    return ModelConfig(**common_from_gguf(meta, vocab_size), rope_interleaved=True)


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    return ModelConfig(**common_from_hf(cfg, "llama"))


FAMILY = Family(
    gguf_arch="llama",
    hf_architectures=("LlamaForCausalLM",),
    config_from_gguf=config_from_gguf,
    config_from_hf=config_from_hf,
)
