"""Muse Glimmer's vision side as one object: the tower's shape (MuseGlimmerVisionConfig: a ViT of LayerNorm
blocks with 2D RoPE, windowed attention over `pos_emb_height`-patch windows except every 4th and the last
layer, a 2x2 pixel shuffle), the adapter and projection to the text width (MuseGlimmerConfig's
`projector_hidden_size`), the text model's RMS epsilon (the image features are RMS-normed without a scale
at it, as its token embeddings are) and the image processor's settings (MuseGlimmerImageProcessor: a
token-capped, aspect-keeping resize, LANCZOS, mean = std = 0.5), parsed from config.json's `vision_config`
and preprocessor_config.json (or processor_config.json's `image_processor`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from app.engine.loader.names import CheckpointError
from app.engine.models.vision.merged_patches import MergedPatchTower

# MuseGlimmerImageProcessor's and MuseGlimmerVisionConfig's defaults: real files list only what differs.
PROCESSOR_DEFAULTS: dict[str, Any] = {
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "max_image_tokens": 4096,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "rescale_factor": 1 / 255,
    "resample": 1,  # PIL LANCZOS
}
VISION_DEFAULTS: dict[str, Any] = {
    "patch_size": 14,
    "pos_emb_height": 32,
    "pos_emb_width": 32,
    "num_attention_heads": 16,
    "num_hidden_layers": 50,
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "hidden_act": "gelu",
    "patch_temporal": 2,
    "merge_size": 2,
    "layer_norm_eps": 1e-5,
}
ROPE_THETA = 10_000.0
TEXT_RMS_EPS = 1e-5  # MuseGlimmerTextConfig's rms_norm_eps
FULL_PERIOD = 4  # every 4th layer (and the last) attends over the whole image


def full_layers(num_layers: int, period: int = FULL_PERIOD) -> tuple[int, ...]:
    """The layers attending over the whole image: every `period`-th and the last (transformers' default
    layer_types, llama.cpp's `muse_glimmer_sparse_factor`)."""
    return tuple(i for i in range(num_layers) if (i + 1) % period == 0 or i == num_layers - 1)


@dataclass(frozen=True)
class MuseGlimmerVisionConfig(MergedPatchTower):
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    patch_size: int
    position_side: int  # the learned position table is position_side^2; windows are that many patches a side
    merge_size: int
    temporal_patch_size: int
    full_attention_layers: tuple[int, ...]
    projector_hidden_size: int
    text_hidden_size: int
    layer_norm_eps: float = 1e-5  # ln_pre / ln_post (the blocks' norms are built at 1e-5 whatever it says)
    rope_theta: float = ROPE_THETA
    text_rms_eps: float = TEXT_RMS_EPS
    # the image processor
    max_image_tokens: int = 4096
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255
    resample: int = 1

    @property
    def image_size(self) -> int:
        """Side of the largest square image the token cap takes whole (what page images are rendered at)."""
        return math.isqrt(self.max_image_tokens) * self.factor

    @property
    def frame_dim(self) -> int:
        """Values of one patch of one frame (3 x p x p); the processor repeats the frame over the temporal patch."""
        return 3 * self.patch_size * self.patch_size

    def check(self, where: str = "config.json vision_config") -> MuseGlimmerVisionConfig:
        self.check_rotary_heads(where)
        if min(self.patch_size, self.position_side, self.merge_size, self.max_image_tokens) < 1:
            raise CheckpointError(f"{where}: patch, position table, merge and token cap must be positive")
        return self


def tower_shapes(cfg: MuseGlimmerVisionConfig) -> dict[str, tuple[int, ...]]:
    """Each tensor the tower reads (muse_glimmer_vision.py's names: `tower.*`, `adapter.*`, `projection.*`)
    and its shape as the folder stores it; the patch embedding reads `temporal_patch_size` frames."""
    h, ff, pj = cfg.hidden_size, cfg.intermediate_size, cfg.projector_hidden_size
    shapes: dict[str, tuple[int, ...]] = {
        "tower.patch_embedder.patch_embedding.weight": (h, cfg.temporal_patch_size * cfg.frame_dim),
        "tower.patch_embedder.position_embedding_table.weight": (cfg.position_side**2, h),
        "adapter.fc1.weight": (pj, h * cfg.merge_unit), "adapter.fc2.weight": (pj, pj),
        "projection.weight": (cfg.text_hidden_size, pj),
    }  # fmt: skip
    vectors = ["tower.ln_pre", "tower.ln_post"]
    for i in range(cfg.num_layers):
        p = f"tower.layers.{i}"
        vectors += [f"{p}.norm1", f"{p}.norm2"]
        for part, (rows, cols) in {"attn.q_proj": (h, h), "attn.k_proj": (h, h), "attn.v_proj": (h, h),
                                   "attn.proj": (h, h), "mlp.fc1": (ff, h), "mlp.fc2": (h, ff)}.items():  # fmt: skip
            shapes |= {f"{p}.{part}.weight": (rows, cols), f"{p}.{part}.bias": (rows,)}
    for name in vectors:
        shapes |= {f"{name}.weight": (h,), f"{name}.bias": (h,)}
    return shapes


def _checked(values: dict[str, Any], key: str, expected: Any, where: str) -> None:
    if values.get(key, expected) != expected:
        raise CheckpointError(f"{where} {key} is {values[key]!r}: only {expected!r} is supported")


def muse_glimmer_vision_config(
    cfg: dict[str, Any], processor: dict[str, Any] | None, processor_source: str = "preprocessor_config.json"
) -> MuseGlimmerVisionConfig:
    """From MuseGlimmerForConditionalGeneration's config.json (+ the image processor's settings, if any)."""
    vision = {**VISION_DEFAULTS, **cfg["vision_config"]}
    proc = {**PROCESSOR_DEFAULTS, **(processor or {})}
    text = cfg.get("text_config") or {}
    where = "config.json vision_config"
    _checked(vision, "hidden_act", "gelu", where)
    _checked(cfg, "projector_hidden_act", "gelu", "config.json")
    _checked(vision.get("rope_parameters") or {}, "rope_type", "axial", f"{where} rope_parameters")
    if vision["pos_emb_height"] != vision["pos_emb_width"]:
        raise CheckpointError(
            f"{where}: a {vision['pos_emb_height']}x{vision['pos_emb_width']} position table; only square ones "
            "are supported (as in transformers)"
        )
    for key, proc_key in (("patch_size", "patch_size"), ("merge_size", "merge_size"),
                          ("patch_temporal", "temporal_patch_size")):  # fmt: skip
        if int(vision[key]) != int(proc[proc_key]):
            raise CheckpointError(
                f"{processor_source} {proc_key} {proc[proc_key]} differs from vision_config {key} {vision[key]}"
            )
    layers = int(vision["num_hidden_layers"])
    types = vision.get("layer_types")
    full = full_layers(layers) if types is None else tuple(i for i, t in enumerate(types) if t == "full_attention")
    if types is not None and len(types) != layers:
        raise CheckpointError(f"{where} layer_types lists {len(types)} layers, not {layers}")
    merged = int(vision["hidden_size"]) * int(vision["merge_size"]) ** 2
    if int(cfg.get("out_hidden_size", merged)) != merged:
        raise CheckpointError(
            f"config.json out_hidden_size {cfg['out_hidden_size']} is not the merged tower width {merged}"
        )
    return MuseGlimmerVisionConfig(
        num_layers=layers,
        hidden_size=int(vision["hidden_size"]),
        intermediate_size=int(vision["intermediate_size"]),
        num_heads=int(vision["num_attention_heads"]),
        patch_size=int(vision["patch_size"]),
        position_side=int(vision["pos_emb_height"]),
        merge_size=int(vision["merge_size"]),
        temporal_patch_size=int(vision["patch_temporal"]),
        full_attention_layers=full,
        projector_hidden_size=int(cfg.get("projector_hidden_size", 4096)),
        text_hidden_size=int(text.get("hidden_size", 6656)),
        layer_norm_eps=float(vision["layer_norm_eps"]),
        rope_theta=float((vision.get("rope_parameters") or {}).get("rope_theta", ROPE_THETA)),
        text_rms_eps=float(text.get("rms_norm_eps", TEXT_RMS_EPS)),
        max_image_tokens=int(proc["max_image_tokens"]),
        image_mean=tuple(float(v) for v in proc["image_mean"]),
        image_std=tuple(float(v) for v in proc["image_std"]),
        rescale_factor=float(proc["rescale_factor"]),
        resample=int(proc["resample"]),
    ).check(where)
