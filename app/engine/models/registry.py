"""Architecture name -> family module, imported on first use."""

from __future__ import annotations

import importlib
from typing import Any

from app.engine.models.config import ModelConfig
from app.engine.models.decoder import DecoderModel
from app.engine.models.family import Family

_FAMILY_MODULES = {
    "gemma3": "app.engine.models.gemma3",
    "llama": "app.engine.models.llama",
    "qwen2": "app.engine.models.qwen2",
    "qwen3": "app.engine.models.qwen3",
}


class UnsupportedArchitecture(ValueError):
    pass


def supported_architectures() -> list[str]:
    return sorted(_FAMILY_MODULES)


def family(architecture: str) -> Family:
    """The family for a GGUF architecture name or a Hugging Face class name."""
    if architecture in _FAMILY_MODULES:
        return importlib.import_module(_FAMILY_MODULES[architecture]).FAMILY
    for module in _FAMILY_MODULES.values():
        fam = importlib.import_module(module).FAMILY
        if architecture in fam.hf_architectures:
            return fam
    raise UnsupportedArchitecture(
        f"Unsupported model architecture {architecture!r}. Supported: {', '.join(supported_architectures())}"
    )


def model_config(checkpoint: Any) -> ModelConfig:
    """Parse the checkpoint's own description of itself into a ModelConfig."""
    fam = family(checkpoint.architecture)
    if checkpoint.format == "gguf":
        vocab_size = checkpoint.tensors["token_embd.weight"].shape[0]
        return fam.config_from_gguf(checkpoint.metadata, vocab_size)
    return fam.config_from_hf(checkpoint.hf_config)


def build_model(
    checkpoint: Any, backend: Any, max_positions: int, cfg: ModelConfig | None = None
) -> DecoderModel:
    cfg = cfg or model_config(checkpoint)
    fam = family(checkpoint.architecture)
    tensors = checkpoint.tensors
    if checkpoint.format != "gguf":
        tensors = fam.adapt_hf_tensors(tensors, cfg)
    freq_factors = tensors.get("rope_freqs.weight")
    return DecoderModel(
        cfg,
        tensors,
        backend,
        max_positions,
        freq_factors=freq_factors.dequantize() if freq_factors is not None else None,
    )
