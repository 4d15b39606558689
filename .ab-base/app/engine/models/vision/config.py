"""What a vision tower is made of, parsed from a Hugging Face folder or a llama.cpp `mmproj` GGUF.

`VisionConfig` is the SigLIP encoder's shape, Gemma 3's projector (average pooling down to
`tokens_per_image` soft tokens, then a projection to the text width) and the image processor's
settings (size, mean/std, pan-and-scan), so one object says how an image becomes embeddings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from app.engine.loader.names import CheckpointError

# Gemma3ImageProcessor's and SiglipVisionConfig's defaults: real files list only what differs.
PROCESSOR_DEFAULTS: dict[str, Any] = {
    "size": {"height": 896, "width": 896},
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "rescale_factor": 1 / 255,
    "resample": 2,  # PIL bilinear
    "do_pan_and_scan": False,
    "pan_and_scan_min_crop_size": 256,
    "pan_and_scan_max_num_crops": 4,
    "pan_and_scan_min_ratio_to_activate": 1.2,
}
SIGLIP_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "image_size": 896,
    "patch_size": 14,
    "layer_norm_eps": 1e-6,
    "num_channels": 3,
}
DEFAULT_SCALE_FACTOR = 4  # llama.cpp's Gemma 3 pooling when the mmproj does not state it


@dataclass(frozen=True)
class PanAndScan:
    min_crop_size: int
    max_num_crops: int
    min_ratio_to_activate: float


@dataclass(frozen=True)
class VisionConfig:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    image_size: int  # square side the tower takes
    patch_size: int
    layer_norm_eps: float
    text_hidden_size: int
    tokens_per_image: int  # soft tokens after the projector's pooling
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    rescale_factor: float = 1 / 255
    resample: int = 2
    pan_and_scan: PanAndScan | None = None  # None: whole images only

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def pool_kernel(self) -> int:
        """Side of the average-pooling window: patches per side over soft tokens per side."""
        return self.patches_per_side // math.isqrt(self.tokens_per_image)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def check(self, where: str) -> VisionConfig:
        side = math.isqrt(self.tokens_per_image)
        if self.image_size % self.patch_size or side * side != self.tokens_per_image:
            raise CheckpointError(
                f"{where}: image_size {self.image_size} / patch_size {self.patch_size} and "
                f"{self.tokens_per_image} tokens per image do not make a square grid"
            )
        if self.patches_per_side % side or self.hidden_size % self.num_heads:
            raise CheckpointError(
                f"{where}: {self.patches_per_side} patches per side do not pool evenly into {side}, "
                f"or hidden size {self.hidden_size} is not a multiple of {self.num_heads} heads"
            )
        return self


def _pan_and_scan(proc: dict[str, Any]) -> PanAndScan | None:
    if not proc.get("do_pan_and_scan"):
        return None
    return PanAndScan(
        int(proc["pan_and_scan_min_crop_size"]),
        int(proc["pan_and_scan_max_num_crops"]),
        float(proc["pan_and_scan_min_ratio_to_activate"]),
    )


def vision_config_from_hf(
    cfg: dict[str, Any], processor: dict[str, Any] | None, processor_source: str = "preprocessor_config.json"
) -> VisionConfig:
    """From Gemma3ForConditionalGeneration's config.json (+ the image processor's settings, if any:
    `processor_source` names where they came from, loader/processor_config.py)."""
    vision = {**SIGLIP_DEFAULTS, **cfg["vision_config"]}
    proc = {**PROCESSOR_DEFAULTS, **(processor or {})}
    text_hidden = (cfg.get("text_config") or {}).get("hidden_size", 2304)
    size = proc["size"]
    if size.get("height", vision["image_size"]) != vision["image_size"]:
        raise CheckpointError(
            f"{processor_source} size {size} differs from vision_config image_size {vision['image_size']}"
        )
    return VisionConfig(
        hidden_size=int(vision["hidden_size"]),
        intermediate_size=int(vision["intermediate_size"]),
        num_layers=int(vision["num_hidden_layers"]),
        num_heads=int(vision["num_attention_heads"]),
        image_size=int(vision["image_size"]),
        patch_size=int(vision["patch_size"]),
        layer_norm_eps=float(vision["layer_norm_eps"]),
        text_hidden_size=int(text_hidden),
        tokens_per_image=int(cfg.get("mm_tokens_per_image", 256)),
        image_mean=tuple(float(v) for v in proc["image_mean"]),
        image_std=tuple(float(v) for v in proc["image_std"]),
        rescale_factor=float(proc["rescale_factor"]),
        resample=int(proc["resample"]),
        pan_and_scan=_pan_and_scan(proc),
    ).check("config.json vision_config")


def vision_config_from_gguf(meta: dict[str, Any], text_hidden_size: int) -> VisionConfig:
    """From an mmproj GGUF's `clip.*` keys (llama.cpp's convert_hf_to_gguf.py writes them)."""
    projector = meta.get("clip.projector_type") or meta.get("clip.vision.projector_type")
    if projector != "gemma3":
        raise CheckpointError(f"mmproj projector type {projector!r} is not supported (expected 'gemma3')")

    def key(name: str) -> Any:
        full = f"clip.vision.{name}"
        if full not in meta:
            raise CheckpointError(f"mmproj metadata has no {full}")
        return meta[full]

    image_size, patch = int(key("image_size")), int(key("patch_size"))
    scale = int(meta.get("clip.vision.projector.scale_factor", DEFAULT_SCALE_FACTOR))
    side = image_size // patch // scale
    mean = meta.get("clip.vision.image_mean", PROCESSOR_DEFAULTS["image_mean"])
    std = meta.get("clip.vision.image_std", PROCESSOR_DEFAULTS["image_std"])
    return VisionConfig(
        hidden_size=int(key("embedding_length")),
        intermediate_size=int(key("feed_forward_length")),
        num_layers=int(key("block_count")),
        num_heads=int(key("attention.head_count")),
        image_size=image_size,
        patch_size=patch,
        layer_norm_eps=float(meta.get("clip.vision.attention.layer_norm_epsilon", 1e-6)),
        text_hidden_size=text_hidden_size,
        tokens_per_image=side * side,
        image_mean=tuple(float(v) for v in mean),
        image_std=tuple(float(v) for v in std),
    ).check("mmproj metadata")
