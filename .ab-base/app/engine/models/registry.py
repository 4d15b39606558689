"""Architecture name -> family module, imported on first use."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from app.engine.loader.names import CheckpointError
from app.engine.models.checks import check_against_tensors
from app.engine.models.config import GGUF_KEYS, HF_KEYS, ModelConfig
from app.engine.models.decoder import DecoderModel
from app.engine.models.family import Family

_FAMILY_MODULES = {
    "gemma3": "app.engine.models.gemma3",
    "gemma4": "app.engine.models.gemma4",
    "gpt-oss": "app.engine.models.gpt_oss",
    "granite": "app.engine.models.granite",
    "llama": "app.engine.models.llama",
    "qwen2": "app.engine.models.qwen2",
    "qwen2vl": "app.engine.models.qwen2_vl",
    "qwen3": "app.engine.models.qwen3",
    # llama.cpp's Qwen3-VL text arch, which its converter also gives Qwen3-ASR's text side: the Qwen3 block,
    # its multi-axis RoPE the plain one for text positions (all axes equal); no deepstack layers are read
    "qwen3vl": "app.engine.models.qwen3",
    "qwen3moe": "app.engine.models.qwen3moe",
    "qwen35": "app.engine.models.qwen35",
    "qwen35moe": "app.engine.models.qwen35moe",
    "qwen3next": "app.engine.models.qwen3next",
    "nemotron_h": "app.engine.models.nemotron_h",
    "nemotron_h_moe": "app.engine.models.nemotron_h",  # the same family with experts
    "granitehybrid": "app.engine.models.granite_hybrid",
    "laguna": "app.engine.models.laguna",
    "muse-glimmer": "app.engine.models.muse_glimmer",
    "paddleocr": "app.engine.models.paddleocr",
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
    tensors = checkpoint.tensors
    try:
        if checkpoint.format == "gguf":
            embedding = tensors.get("token_embd.weight")
            if embedding is None:
                raise CheckpointError("the checkpoint has no token embedding (token_embd.weight)")
            cfg = fam.complete_gguf_config(
                fam.config_from_gguf(checkpoint.metadata, embedding.shape[0]), tensors
            )
            key = _gguf_key(checkpoint)
        else:
            cfg, key = fam.config_from_hf(checkpoint.hf_config), _hf_key
        check_against_tensors(cfg, tensors, key)
    except CheckpointError as exc:  # the config's own messages name keys and tensors; add the file
        raise CheckpointError(f"{checkpoint.path}: {exc}") from None
    return cfg


def _gguf_key(checkpoint: Any) -> Callable[[str], str]:
    arch = checkpoint.metadata["general.architecture"]
    return lambda field: "token_embd.weight rows" if field == "vocab_size" else f"{arch}.{GGUF_KEYS[field]}"


def _hf_key(field: str) -> str:
    return f"config.json {HF_KEYS[field]}"


def build_model(
    checkpoint: Any, backend: Any, max_positions: int, cfg: ModelConfig | None = None
) -> DecoderModel:
    cfg = cfg or model_config(checkpoint)
    fam = family(checkpoint.architecture)
    tensors = checkpoint.tensors
    if checkpoint.format != "gguf":
        tensors = fam.adapt_hf_tensors(tensors, cfg)
    else:
        tensors = fam.adapt_gguf_tensors(tensors, cfg)
    freq_factors = tensors.get("rope_freqs.weight")
    return DecoderModel(
        cfg,
        tensors,
        backend,
        max_positions,
        freq_factors=freq_factors.dequantize() if freq_factors is not None else None,
    )
