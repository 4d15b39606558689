"""Qwen3.5-MoE (35B-A3B, 122B-A10B, 397B-A17B): Qwen3.5's hybrid layers (qwen35.py) with Qwen3-Next's
mixture of experts and gated shared expert in every layer (qwen3next.py). The router always
renormalises its top k. llama.cpp's GGUFs reorder the Gated DeltaNet value heads "tiled", as for
Qwen3.5; Hugging Face folders may hold the experts stacked (`mlp.experts.gate_up_proj`).
"""

from __future__ import annotations

from typing import Any

from app.engine.models.config import ModelConfig
from app.engine.models.family import Family
from app.engine.models.qwen3next import moe_from_gguf, moe_from_hf
from app.engine.models.qwen35 import adapt_gguf_tensors, adapt_hf_tensors, hybrid_from_gguf, hybrid_from_hf


def config_from_gguf(meta: dict[str, Any], vocab_size: int) -> ModelConfig:
    return hybrid_from_gguf(meta, vocab_size, tiled_v_heads=True, moe=moe_from_gguf(meta))


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    return hybrid_from_hf(cfg, "qwen35moe", moe=moe_from_hf(cfg, normalize=True))


FAMILY = Family(
    gguf_arch="qwen35moe",
    hf_architectures=("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration"),
    config_from_gguf=config_from_gguf,
    config_from_hf=config_from_hf,
    adapt_hf_tensors=adapt_hf_tensors,
    adapt_gguf_tensors=adapt_gguf_tensors,
)
