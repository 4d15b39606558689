"""What a model family module provides to the registry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.engine.models.config import ModelConfig
from app.engine.quant.dispatch import QuantizedTensor

Tensors = dict[str, QuantizedTensor]


def _no_quirks(tensors: Tensors, cfg: ModelConfig) -> Tensors:
    return tensors


def _as_read(cfg: ModelConfig, tensors: Tensors) -> ModelConfig:
    return cfg


@dataclass(frozen=True)
class Family:
    gguf_arch: str
    hf_architectures: tuple[str, ...]
    config_from_gguf: Callable[[dict[str, Any], int], ModelConfig]
    config_from_hf: Callable[[dict[str, Any]], ModelConfig]
    # Checkpoint quirks of Hugging Face files, applied to the tensors beside the model that needs them.
    adapt_hf_tensors: Callable[[Tensors, ModelConfig], Tensors] = _no_quirks
    # The same for GGUF files, where the family's names differ from the shared decoder's.
    adapt_gguf_tensors: Callable[[Tensors, ModelConfig], Tensors] = _no_quirks
    # What a GGUF's metadata leaves to its tensors (Gemma 4: a global layer without `attn_v` takes its
    # keys as values), completed before the config is checked against them.
    complete_gguf_config: Callable[[ModelConfig, Tensors], ModelConfig] = _as_read
