"""Qwen 3 (dense): the Llama block with per-head RMS norms on queries and keys, no biases."""

from __future__ import annotations

from typing import Any

from app.engine.models.config import ModelConfig, common_from_gguf, common_from_hf
from app.engine.models.family import Family


def config_from_gguf(meta: dict[str, Any], vocab_size: int) -> ModelConfig:
    return ModelConfig(**common_from_gguf(meta, vocab_size), qk_norm=True)


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    return ModelConfig(**common_from_hf(cfg, "qwen3"), qk_norm=True)


FAMILY = Family(
    gguf_arch="qwen3",
    hf_architectures=("Qwen3ForCausalLM",),
    config_from_gguf=config_from_gguf,
    config_from_hf=config_from_hf,
)
