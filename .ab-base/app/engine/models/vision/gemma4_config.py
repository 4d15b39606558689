"""Gemma 4's vision tower: its config (config.json + the image processor's settings, either layout)
and tensors from a Hugging Face folder.

Tensors keep their Hugging Face names with the `model.vision_tower.` / `model.embed_vision.`
prefixes stripped to `tower.` / `embedder.` (gemma4_mmproj.py maps llama.cpp's mmproj names to these).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.engine.loader.names import CheckpointError
from app.engine.loader.processor_config import read_processor_settings
from app.engine.loader.safetensors import read_safetensors_file, weight_files
from app.engine.quant.dispatch import QuantizedTensor

Tensors = dict[str, QuantizedTensor]
_PREFIXES = {"vision_tower.": "tower.", "embed_vision.": "embedder."}
SUPPORTED_SOFT_TOKENS = (70, 140, 280, 560, 1120)  # Gemma4ImageProcessor's budgets


@dataclass(frozen=True)
class Gemma4VisionConfig:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    patch_size: int
    position_embedding_size: int
    pooling_kernel_size: int
    rope_theta: float
    rms_norm_eps: float
    standardize: bool
    clipped_linears: bool
    text_hidden_size: int
    # text_config.use_bidirectional_attention == "vision": image tokens attend both ways in the text model's
    # sliding layers (within the window), causally in its global ones
    two_way_images: bool
    # the image processor's: at most max_soft_tokens * k^2 patches, PIL resample, rescale (no normalize)
    max_soft_tokens: int = 280
    resample: int = 3
    rescale_factor: float = 1 / 255

    @property
    def max_patches(self) -> int:
        return self.max_soft_tokens * self.pooling_kernel_size**2


def gemma4_vision_config(
    hf_config: dict[str, Any], processor: dict[str, Any] | None = None
) -> Gemma4VisionConfig:
    """From a Gemma4ForConditionalGeneration config.json and its image processor's settings;
    CheckpointError naming what is unsupported."""
    vc, text, proc = hf_config["vision_config"], hf_config.get("text_config") or {}, processor or {}
    rope = vc.get("rope_parameters") or {"rope_type": "axial", "rope_theta": 100.0}
    if rope.get("rope_type", "axial") != "axial":
        raise CheckpointError(f"Gemma 4 vision takes axial RoPE only, not {rope.get('rope_type')!r}")
    if vc.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise CheckpointError(f"Gemma 4 vision activation {vc['hidden_activation']!r} is not supported")
    if "hidden_size" not in text:
        raise CheckpointError("config.json has no text_config.hidden_size for the vision embedder")
    budget = proc.get("max_soft_tokens", 280)
    if budget not in SUPPORTED_SOFT_TOKENS:
        raise CheckpointError(f"max_soft_tokens {budget} is not one of {SUPPORTED_SOFT_TOKENS}")
    for key, ours in (("patch_size", "patch_size"), ("pooling_kernel_size", "pooling_kernel_size")):
        if key in proc and proc[key] != vc.get(ours, proc[key]):
            raise CheckpointError(
                f"the image processor's {key} {proc[key]} is not the vision tower's {vc[ours]}"
            )
    if proc.get("do_normalize", False):
        raise CheckpointError("a Gemma 4 image processor with do_normalize on is not supported")
    heads = vc.get("num_attention_heads", 12)
    return Gemma4VisionConfig(
        hidden_size=vc.get("hidden_size", 768),
        intermediate_size=vc.get("intermediate_size", 3072),
        num_layers=vc.get("num_hidden_layers", 16),
        num_heads=heads,
        num_kv_heads=vc.get("num_key_value_heads", heads),
        head_dim=vc.get("head_dim", 64),
        patch_size=vc.get("patch_size", 16),
        position_embedding_size=vc.get("position_embedding_size", 10 * 1024),
        pooling_kernel_size=vc.get("pooling_kernel_size", 3),
        rope_theta=float(rope.get("rope_theta", 100.0)),
        rms_norm_eps=vc.get("rms_norm_eps", 1e-6),
        standardize=bool(vc.get("standardize", False)),
        clipped_linears=bool(vc.get("use_clipped_linears", False)),
        text_hidden_size=text["hidden_size"],
        two_way_images=text.get("use_bidirectional_attention") == "vision",
        max_soft_tokens=budget,
        resample=int(proc.get("resample", 3)),
        rescale_factor=float(proc.get("rescale_factor", 1 / 255)),
    )


def load_gemma4_vision(folder: Path, hf_config: dict[str, Any]) -> tuple[Gemma4VisionConfig, Tensors] | None:
    """The vision side of a Gemma 4 folder; None for a text-only one."""
    if not hf_config.get("vision_config"):
        return None
    settings = read_processor_settings(folder, "image_processor")
    try:
        cfg = gemma4_vision_config(hf_config, settings.values)
    except CheckpointError as exc:
        raise CheckpointError(f"{folder} ({settings.source}): {exc}") from None
    tensors: Tensors = {}
    for file in weight_files(folder):
        for hf_name, tensor in read_safetensors_file(file).items():
            name = hf_name.removeprefix("model.")
            for prefix, ours in _PREFIXES.items():
                if name.startswith(prefix):
                    new = ours + name.removeprefix(prefix)
                    tensors[new] = QuantizedTensor(new, tensor.qtype, tensor.shape, tensor.data)
    if "embedder.embedding_projection.weight" not in tensors:
        raise CheckpointError(f"{folder}: a vision_config but no embed_vision.embedding_projection.weight")
    return cfg, tensors
