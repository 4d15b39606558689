"""Qwen 2 / 2.5: the Llama block with biases on the q, k and v projections."""

from __future__ import annotations

from typing import Any

from app.engine.models.config import ModelConfig, common_from_gguf, common_from_hf
from app.engine.models.family import Family


def config_from_gguf(meta: dict[str, Any], vocab_size: int) -> ModelConfig:
    return ModelConfig(**common_from_gguf(meta, vocab_size), qkv_bias=True)


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    return ModelConfig(**common_from_hf(cfg, "qwen2"), qkv_bias=True)


FAMILY = Family(
    gguf_arch="qwen2",
    hf_architectures=("Qwen2ForCausalLM",),
    config_from_gguf=config_from_gguf,
    config_from_hf=config_from_hf,
)
