"""Qwen2.5-VL's vision side as one object: the tower's shape (patch embedding over a temporal
patch, window attention with full-attention layers at `fullatt_block_indexes`, the 2x2 patch
merger to the text width) and its image processor's settings (Qwen2VLImageProcessor: dynamic
resolution within min/max pixels, CLIP mean/std, bicubic), parsed from config.json's
`vision_config` and the image processor's settings (preprocessor_config.json, or
processor_config.json's `image_processor` as transformers 5 saves them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.engine.loader.names import CheckpointError
from app.engine.models.vision.merged_patches import DynamicResolution, MergedPatchTower, dynamic_resolution

# Qwen2VLImageProcessor's and Qwen2_5_VLVisionConfig's defaults: real files list only what differs.
PROCESSOR_DEFAULTS: dict[str, Any] = {
    "min_pixels": 56 * 56,  # read by merged_patches.pixels_bounds only, never merged over a file's size
    "max_pixels": 28 * 28 * 1280,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "rescale_factor": 1 / 255,
    "resample": 3,  # PIL bicubic
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
}
VISION_DEFAULTS: dict[str, Any] = {
    "depth": 32,
    "hidden_size": 3584,
    "hidden_act": "silu",
    "intermediate_size": 3420,
    "num_heads": 16,
    "in_channels": 3,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,
    "out_hidden_size": 3584,
    "fullatt_block_indexes": [7, 15, 23, 31],
}
RMS_EPS = 1e-6  # Qwen2.5-VL's vision norms are built with this eps, whatever the config says
ROPE_THETA = 10_000.0


@dataclass(frozen=True)
class QwenVisionConfig(MergedPatchTower, DynamicResolution):  # DynamicResolution: the image processor
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    in_channels: int
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    window_size: int  # in pixels; windows are window_size / merge / patch merged patches a side
    out_hidden_size: int  # the text model's width
    fullatt_block_indexes: tuple[int, ...]
    rope_theta: float
    rms_eps: float = RMS_EPS  # the tower's and merger's RMSNorms

    @property
    def window_merged(self) -> int:
        """Side of one attention window, in merged patches."""
        return self.window_size // self.merge_size // self.patch_size

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size

    def check(
        self, where: str = "config.json vision_config", processor: str = "preprocessor_config.json"
    ) -> QwenVisionConfig:
        """`where` / `processor`: what to name in errors about the tower's / the processor's settings."""
        self.check_rotary_heads(where)
        if self.window_merged < 1:
            raise CheckpointError(f"{where}: window_size {self.window_size} is under one merged patch")
        bad = [i for i in self.fullatt_block_indexes if not 0 <= i < self.depth]
        if bad:
            raise CheckpointError(f"{where}: fullatt_block_indexes {bad} are outside the {self.depth} layers")
        self.check_pixels_bounds(processor)
        return self


def qwen_vision_config(
    cfg: dict[str, Any], processor: dict[str, Any] | None, processor_source: str = "preprocessor_config.json"
) -> QwenVisionConfig:
    """From Qwen2_5_VLForConditionalGeneration's config.json (+ the image processor's settings, if
    any: `processor_source` names where they came from, loader/processor_config.py)."""
    vision = {**VISION_DEFAULTS, **cfg["vision_config"]}
    proc = {**PROCESSOR_DEFAULTS, **(processor or {})}
    for key, proc_key in (("patch_size", "patch_size"), ("temporal_patch_size", "temporal_patch_size"),
                          ("spatial_merge_size", "merge_size")):  # fmt: skip
        if int(vision[key]) != int(proc[proc_key]):
            raise CheckpointError(
                f"{processor_source} {proc_key} {proc[proc_key]} differs from vision_config "
                f"{key} {vision[key]}"
            )
    if vision["hidden_act"] != "silu":
        raise CheckpointError(
            f"config.json vision_config hidden_act {vision['hidden_act']!r}: only 'silu' is supported"
        )
    text_hidden = (cfg.get("text_config") or cfg).get("hidden_size")
    if text_hidden is not None and int(text_hidden) != int(vision["out_hidden_size"]):
        raise CheckpointError(
            f"config.json vision_config out_hidden_size {vision['out_hidden_size']} differs from the text hidden size {text_hidden}"
        )
    rope = vision.get("rope_parameters") or {}
    return QwenVisionConfig(
        depth=int(vision["depth"]),
        hidden_size=int(vision["hidden_size"]),
        intermediate_size=int(vision["intermediate_size"]),
        num_heads=int(vision["num_heads"]),
        in_channels=int(vision["in_channels"]),
        patch_size=int(vision["patch_size"]),
        temporal_patch_size=int(vision["temporal_patch_size"]),
        merge_size=int(vision["spatial_merge_size"]),
        window_size=int(vision["window_size"]),
        out_hidden_size=int(vision["out_hidden_size"]),
        fullatt_block_indexes=tuple(int(i) for i in vision["fullatt_block_indexes"]),
        rope_theta=float(rope.get("rope_theta", ROPE_THETA)),
        **dynamic_resolution(processor, PROCESSOR_DEFAULTS),
    ).check(processor=processor_source)
