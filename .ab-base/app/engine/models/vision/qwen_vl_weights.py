"""Qwen2.5-VL's vision tensors and config from a Hugging Face folder: the `visual.*` tensors
(`model.visual.*` in transformers 5's own layout) under their names without that prefix."""

from __future__ import annotations

from pathlib import Path

from app.engine.loader.names import CheckpointError
from app.engine.loader.processor_config import read_processor_settings
from app.engine.models.vision.qwen_vl_config import QwenVisionConfig, qwen_vision_config
from app.engine.models.vision.weights import parsed_in, read_prefixed
from app.engine.quant.dispatch import QuantizedTensor

Tensors = dict[str, QuantizedTensor]
_PREFIXES = {"model.visual.": "", "visual.": ""}


def load_qwen_vision(folder: Path, hf_config: dict) -> tuple[QwenVisionConfig, Tensors] | None:
    """The vision side of a Qwen2_5_VLForConditionalGeneration folder; None without a vision_config."""
    if "vision_config" not in hf_config:
        return None
    settings = read_processor_settings(folder, "image_processor")
    cfg = parsed_in(folder, lambda: qwen_vision_config(hf_config, settings.values, settings.source))
    tensors = read_prefixed(folder, _PREFIXES)
    expected = ["patch_embed.proj.weight", "merger.ln_q.weight", "merger.mlp.0.weight", "merger.mlp.2.weight"]
    expected += [f"blocks.{i}.attn.qkv.weight" for i in range(cfg.depth)]
    missing = [f"visual.{n}" for n in expected if n not in tensors]
    if missing:
        raise CheckpointError(f"{folder}: the vision checkpoint lacks {', '.join(missing[:4])}")
    return cfg, tensors
