"""Gemma 3 (text): QK norm, sandwich norms, GELU-tanh, scaled embeddings, tied output,
sliding-window layers (5 of every 6) with their own RoPE base.

GGUF leaves the window pattern, the local RoPE base and the query scale implicit: they
come from the architecture, as transformers and llama.cpp both build it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from app.engine.models.config import ModelConfig, common_from_gguf, common_from_hf, positive_number, size
from app.engine.models.family import Family, Tensors
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES

SLIDING_PATTERN = 6  # every 6th layer attends globally
LOCAL_ROPE_THETA = 10_000.0


def _gemma_flags(kwargs: dict[str, Any]) -> dict[str, Any]:
    kwargs.update(
        qk_norm=True,
        sandwich_norm=True,
        activation="gelu_tanh",
        embedding_scale=math.sqrt(kwargs["hidden_size"]),
    )
    return kwargs


def _pattern(num_layers: int) -> tuple[bool, ...]:
    return tuple((i + 1) % SLIDING_PATTERN != 0 for i in range(num_layers))


def config_from_gguf(meta: dict[str, Any], vocab_size: int) -> ModelConfig:
    kwargs = _gemma_flags(common_from_gguf(meta, vocab_size))
    kwargs.update(
        rope_theta_local=LOCAL_ROPE_THETA,
        layer_sliding=_pattern(kwargs["num_layers"]),
        tie_word_embeddings=True,
    )
    if kwargs["hidden_size"] == 5376:  # 27B scales queries by hidden/heads, not head_dim
        kwargs["query_scale"] = (kwargs["hidden_size"] / kwargs["num_heads"]) ** -0.5
    return ModelConfig(**kwargs)


GLOBAL_ROPE_THETA = 1_000_000.0
# Gemma3TextConfig's defaults: real multimodal configs list only what differs from them.
HF_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 131_072,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
}


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    text = {**HF_TEXT_DEFAULTS, **cfg.get("text_config", cfg)}
    if "rope_theta" not in text and "rope_parameters" not in text:
        text["rope_theta"] = GLOBAL_ROPE_THETA  # not merged above: it would override rope_parameters
    kwargs = _gemma_flags(common_from_hf(text, "gemma3"))
    layer_types = text.get("layer_types")
    if layer_types:
        sliding = tuple(t == "sliding_attention" for t in layer_types)
    else:
        pattern = size(
            text.get("sliding_window_pattern") or text.get("_sliding_window_pattern") or SLIDING_PATTERN,
            "config.json sliding_window_pattern",
            "num_layers",
        )
        sliding = tuple((i + 1) % pattern != 0 for i in range(kwargs["num_layers"]))
    local_theta = text.get("rope_local_base_freq")
    params = text.get("rope_parameters") or {}
    if local_theta is None and "sliding_attention" in params:
        local_theta = params["sliding_attention"].get("rope_theta")
    kwargs.update(
        rope_theta_local=float(local_theta or LOCAL_ROPE_THETA),
        sliding_window=size(text["sliding_window"], "config.json sliding_window", "context_length"),
        layer_sliding=sliding,
        query_scale=positive_number(text["query_pre_attn_scalar"], "config.json query_pre_attn_scalar")
        ** -0.5,
        attn_softcap=text.get("attn_logit_softcapping"),
        final_softcap=text.get("final_logit_softcapping"),
        tie_word_embeddings=bool(text.get("tie_word_embeddings", cfg.get("tie_word_embeddings", True))),
    )
    return ModelConfig(**kwargs)


def adapt_hf_tensors(tensors: Tensors, cfg: ModelConfig) -> Tensors:
    """Hugging Face Gemma norms store `w` and compute with `1 + w`; GGUF stores `1 + w`."""
    f32 = QUANT_TYPES["F32"]
    adapted = dict(tensors)
    for name, tensor in tensors.items():
        if name.endswith("norm.weight"):
            adapted[name] = QuantizedTensor.from_float(name, tensor.dequantize() + np.float32(1.0), f32)
    return adapted


FAMILY = Family(
    gguf_arch="gemma3",
    hf_architectures=("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"),
    config_from_gguf=config_from_gguf,
    config_from_hf=config_from_hf,
    adapt_hf_tensors=adapt_hf_tensors,
)
