"""PaddleOCR-VL's vision side as one object: the tower's shape (SigLIP blocks at the page's own
resolution, a learned square grid of positions resized to each image, 2D rotary positions, a 2x2
merge in the projector) and its image processor's settings (dynamic resolution within min/max
pixels, mean/std, bicubic), from config.json's `vision_config` and the image processor's settings
(preprocessor_config.json, or processor_config.json's `image_processor` as transformers 5 saves
them); and the folder's tower and projector tensors under llama.cpp's mmproj names.

The published folder keeps the tower under `visual.vision_model.` and the projector under `mlp_AR.`
(`pre_norm`, `linear_1`, `linear_2`); transformers' own module layout says `model.visual.` and
`model.projector.`. Both are read; the names become `v.*` (weights.siglip_tensor_name) and
`mm.input_norm` / `mm.1` / `mm.2`, as llama.cpp's converter writes them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.engine.loader.names import CheckpointError
from app.engine.loader.processor_config import read_processor_settings
from app.engine.loader.safetensors import read_safetensors_file, weight_files
from app.engine.models.vision.merged_patches import DynamicResolution, MergedPatchTower, dynamic_resolution
from app.engine.models.vision.weights import siglip_tensor_name
from app.engine.quant.dispatch import QuantizedTensor

Tensors = dict[str, QuantizedTensor]

# PaddleOCRVLImageProcessor's and PaddleOCRVisionConfig's defaults: real files list only what differs.
PROCESSOR_DEFAULTS: dict[str, Any] = {
    "min_pixels": 384 * 384,
    "max_pixels": 1536 * 1536,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "rescale_factor": 1 / 255,
    "resample": 3,  # PIL bicubic
    "patch_size": 14,
    "temporal_patch_size": 1,
    "merge_size": 2,
}
VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_channels": 3,
    "image_size": 384,
    "patch_size": 14,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
    "spatial_merge_size": 2,
}
ROPE_THETA = 10_000.0
PROJECTOR_NORM_EPS = 1e-5  # the projector's LayerNorm is built with this eps, whatever the config says
_PROJECTOR = {"pre_norm": "mm.input_norm", "linear_1": "mm.1", "linear_2": "mm.2"}


@dataclass(frozen=True)
class PaddleVisionConfig(MergedPatchTower, DynamicResolution):  # DynamicResolution: the image processor
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_channels: int
    patch_size: int
    position_grid: int  # the learned position table is position_grid x position_grid
    merge_size: int
    layer_norm_eps: float
    text_hidden_size: int  # the projector's output: the text model's width
    rope_theta: float

    @property
    def patch_dim(self) -> int:
        return self.num_channels * self.patch_size * self.patch_size

    def check(self, where: str, processor: str) -> PaddleVisionConfig:
        """`where` / `processor`: what to name in errors about the tower's / the processor's settings."""
        self.check_rotary_heads(where)
        if self.position_grid < 1:
            raise CheckpointError(f"{where}: image_size is under one patch of {self.patch_size}")
        self.check_pixels_bounds(processor)
        return self


def paddle_vision_config(
    cfg: dict[str, Any], processor: dict[str, Any] | None, processor_source: str = "preprocessor_config.json"
) -> PaddleVisionConfig:
    """From PaddleOCRVLForConditionalGeneration's config.json (+ the image processor's settings)."""
    vision = {**VISION_DEFAULTS, **cfg["vision_config"]}
    proc = {**PROCESSOR_DEFAULTS, **(processor or {})}
    for key, proc_key in (("patch_size", "patch_size"), ("spatial_merge_size", "merge_size")):
        if int(vision[key]) != int(proc[proc_key]):
            raise CheckpointError(
                f"{processor_source} {proc_key} {proc[proc_key]} differs from vision_config {key} {vision[key]}"
            )
    if int(proc["temporal_patch_size"]) != 1:
        raise CheckpointError(
            f"{processor_source} temporal_patch_size {proc['temporal_patch_size']}: PaddleOCR-VL takes one frame"
        )
    if vision["hidden_act"] not in ("gelu_pytorch_tanh", "gelu_new"):
        raise CheckpointError(
            f"config.json vision_config hidden_act {vision['hidden_act']!r}: only 'gelu_pytorch_tanh' is supported"
        )
    text = cfg.get("text_config") or cfg
    rope = vision.get("rope_parameters") or {}
    return PaddleVisionConfig(
        num_layers=int(vision["num_hidden_layers"]),
        hidden_size=int(vision["hidden_size"]),
        intermediate_size=int(vision["intermediate_size"]),
        num_heads=int(vision["num_attention_heads"]),
        num_channels=int(vision["num_channels"]),
        patch_size=int(vision["patch_size"]),
        position_grid=int(vision["image_size"]) // int(vision["patch_size"]),
        merge_size=int(vision["spatial_merge_size"]),
        layer_norm_eps=float(vision["layer_norm_eps"]),
        text_hidden_size=int(text["hidden_size"]),
        rope_theta=float(rope.get("rope_theta", ROPE_THETA)),
        **dynamic_resolution(processor, PROCESSOR_DEFAULTS),
    ).check("config.json vision_config", processor_source)


def paddle_tensor_name(hf_name: str) -> str | None:
    """The mmproj name of one tensor of the vision side, or None for a text-side tensor."""
    name = hf_name.removeprefix("model.")
    for prefix in ("mlp_AR.", "projector."):
        if name.startswith(prefix):
            module, _, kind = name.removeprefix(prefix).rpartition(".")
            if module not in _PROJECTOR:
                raise CheckpointError(f"unknown projector tensor {hf_name!r}")
            return f"{_PROJECTOR[module]}.{kind}"
    if not name.startswith("visual."):
        return None
    body = name.removeprefix("visual.").removeprefix("vision_model.")
    if body.startswith("embeddings.packing_position_embedding"):
        return None  # unused by the model (transformers skips it on load)
    return siglip_tensor_name(body, hf_name)


def required_tensors(cfg: PaddleVisionConfig) -> list[str]:
    names = ["v.patch_embd.weight", "v.patch_embd.bias", "v.position_embd.weight", "v.post_ln.weight"]
    names += [f"mm.{part}.{kind}" for part in ("input_norm", "1", "2") for kind in ("weight", "bias")]
    for i in range(cfg.num_layers):
        names += [f"v.blk.{i}.{part}.weight" for part in
                  ("attn_q", "attn_k", "attn_v", "attn_out", "ln1", "ln2", "ffn_up", "ffn_down")]  # fmt: skip
    return names


def check_tensors(cfg: PaddleVisionConfig, tensors: Tensors, where: str) -> None:
    """Every tensor the tower reads is there, at its shape; CheckpointError naming the first that is not."""
    missing = [n for n in required_tensors(cfg) if n not in tensors]
    if missing:
        raise CheckpointError(f"{where}: the vision checkpoint lacks {', '.join(missing[:4])}")
    d, merged = cfg.hidden_size, cfg.hidden_size * cfg.merge_unit
    shapes = {
        "v.patch_embd.weight": (d, cfg.patch_dim),
        "v.position_embd.weight": (cfg.position_grid**2, d),
        "mm.1.weight": (merged, merged),
        "mm.2.weight": (cfg.text_hidden_size, merged),
        "v.blk.0.ffn_up.weight": (cfg.intermediate_size, d),
    }
    for name, shape in shapes.items():
        got = tensors[name].shape
        if (math.prod(got), got[0]) != (math.prod(shape), shape[0]):
            raise CheckpointError(f"{where}: {name} is {list(got)}, the config makes it {list(shape)}")


def load_paddle_vision(folder: Path, hf_config: dict) -> tuple[PaddleVisionConfig, Tensors] | None:
    """The vision side of a PaddleOCRVLForConditionalGeneration folder; None without a vision_config."""
    if "vision_config" not in hf_config:
        return None
    settings = read_processor_settings(folder, "image_processor")
    try:
        cfg = paddle_vision_config(hf_config, settings.values, settings.source)
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, CheckpointError):
            raise CheckpointError(f"{folder}: {exc}") from None
        raise CheckpointError(f"{folder}: config.json vision_config is malformed ({exc!r})") from None
    tensors: Tensors = {}
    for file in weight_files(folder):
        for hf_name, tensor in read_safetensors_file(file).items():
            try:
                name = paddle_tensor_name(hf_name)
            except CheckpointError as exc:
                raise CheckpointError(f"{file}: {exc}") from None
            if name is not None:
                tensors[name] = QuantizedTensor(name, tensor.qtype, tensor.shape, tensor.data)
    check_tensors(cfg, tensors, str(folder))
    return cfg, tensors
