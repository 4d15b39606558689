"""PaddleOCR-VL's text side: ERNIE-4.5-0.3B with Qwen2-VL's multimodal RoPE.

The block is the Llama one (RMSNorm, GQA attention, SwiGLU MLP; embeddings tied to the output),
without biases: `use_bias` true would put one on every projection, which no published checkpoint
has and the shared decoder does not take, so it is refused by name. RoPE is the rotate-half kind
over the whole head, its frequencies split into t/h/w sections (`mrope_section`, 16/24/24 of 64 in
the real model); image tokens take their merged grid's coordinates (models/mrope.py), exactly as
Qwen2.5-VL's, so the family reads its sections the way qwen2_vl.py does.

Checkpoints: the published folder (and what transformers 5 saves) keeps the text weights under
`model.` (the vision side under `visual.` and `mlp_AR.`, which the text loader skips), with a flat
config whose `rope_scaling` carries `mrope_section`; llama.cpp's GGUF is architecture `paddleocr`
with `paddleocr.rope.dimension_sections` and q/k left in Hugging Face's row order (its converter does
not permute ERNIE's projections: the rotation is the NeoX kind, M-RoPE's).
"""

from __future__ import annotations

from typing import Any

from app.engine.loader.names import CheckpointError
from app.engine.models.config import ModelConfig
from app.engine.models.family import Family
from app.engine.models.qwen2_vl import mrope_config_from_gguf, mrope_config_from_hf


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    text = cfg.get("text_config") or cfg
    if text.get("use_bias"):
        raise CheckpointError(
            "config.json use_bias is true: PaddleOCR-VL text projections with biases are not supported"
        )
    if text.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"config.json hidden_act {text['hidden_act']!r}: only 'silu' is supported")
    return mrope_config_from_hf(cfg, "paddleocr")  # no output.weight: the embeddings are the head


def config_from_gguf(meta: dict[str, Any], vocab_size: int) -> ModelConfig:
    return mrope_config_from_gguf(meta, vocab_size)


FAMILY = Family(
    gguf_arch="paddleocr",
    hf_architectures=("PaddleOCRVLForConditionalGeneration",),
    config_from_gguf=config_from_gguf,
    config_from_hf=config_from_hf,
)
