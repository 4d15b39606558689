"""Qwen2.5-VL's vision tensors and config from a Hugging Face folder: the `visual.*` tensors
(`model.visual.*` in transformers 5's own layout) under their names without that prefix."""

from __future__ import annotations

from pathlib import Path

from app.engine.loader.names import CheckpointError
from app.engine.loader.processor_config import read_processor_settings
from app.engine.loader.safetensors import read_safetensors_file, weight_files
from app.engine.models.vision.qwen_vl_config import QwenVisionConfig, qwen_vision_config
from app.engine.quant.dispatch import QuantizedTensor

Tensors = dict[str, QuantizedTensor]
_PREFIXES = ("model.visual.", "visual.")


def load_qwen_vision(folder: Path, hf_config: dict) -> tuple[QwenVisionConfig, Tensors] | None:
    """The vision side of a Qwen2_5_VLForConditionalGeneration folder; None without a vision_config."""
    if "vision_config" not in hf_config:
        return None
    settings = read_processor_settings(folder, "image_processor")
    try:
        cfg = qwen_vision_config(hf_config, settings.values, settings.source)
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, CheckpointError):
            raise CheckpointError(f"{folder}: {exc}") from None
        raise CheckpointError(f"{folder}: config.json vision_config is malformed ({exc!r})") from None
    tensors: Tensors = {}
    for file in weight_files(folder):
        for hf_name, tensor in read_safetensors_file(file).items():
            prefix = next((p for p in _PREFIXES if hf_name.startswith(p)), None)
            if prefix is not None:
                name = hf_name[len(prefix) :]
                tensors[name] = QuantizedTensor(name, tensor.qtype, tensor.shape, tensor.data)
    expected = ["patch_embed.proj.weight", "merger.ln_q.weight", "merger.mlp.0.weight", "merger.mlp.2.weight"]
    expected += [f"blocks.{i}.attn.qkv.weight" for i in range(cfg.depth)]
    missing = [f"visual.{n}" for n in expected if n not in tensors]
    if missing:
        raise CheckpointError(f"{folder}: the vision checkpoint lacks {', '.join(missing[:4])}")
    return cfg, tensors
