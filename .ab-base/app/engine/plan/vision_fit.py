"""The vision tower's share of will-it-fit: its weights as stored, and its working set to encode one image.

The tower is found as the loader finds it (models/vision): an mmproj GGUF beside a text GGUF
(`find_mmproj`), or the `vision_tower.*` / `multi_modal_projector.*` tensors of a Hugging Face
folder whose config.json has a vision_config. Only families the engine gives vision to count one.

SigLIP attends every patch to every patch with no KV cache, one head at a time with the softmax in
place (models/vision/siglip.py `full_attention`): per image, patches^2 float32 scores, beside one
layer's activations, patches x (6 x hidden + 2 x ff) floats (residual, normed copy, q, k, v,
attention output; MLP up and its activation). Images are encoded one view at a time. Qwen2.5-VL's
tower takes images of any size up to its max_pixels, and its full-attention layers attend over all
of an image's patches: it is sized at that largest image; Gemma 4's likewise, at its soft-token budget
(k x k patches per token). So is Muse Glimmer's (its processor caps an image at
`max_image_tokens` merged cells, llama.cpp's mmproj at 4096; its full-attention layers attend over them all);
its tower, adapter and projection are `vision_tower.*`, `vision_adapter.*` and `vision_projection.*`.
So is PaddleOCR-VL's, whose every layer attends over the whole page.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from app.engine.images import VISION_ARCHITECTURES
from app.engine.plan.audio_fit import is_audio_gguf_tensor

FLOAT_BYTES = 4
# config.json's names for the Qwen towers the engine runs (the rest of a vision_config is SigLIP's)
QWEN_VL_MODEL_TYPES = ("qwen2_5_vl",)
QWEN_VL_ARCHITECTURE = "Qwen2_5_VLForConditionalGeneration"
GEMMA4_ARCHITECTURE, GEMMA4_PROJECTOR = "Gemma4ForConditionalGeneration", "gemma4v"
MUSE_GLIMMER_MODEL_TYPE, MUSE_GLIMMER_ARCHITECTURE = "muse_glimmer", "MuseGlimmerForConditionalGeneration"
PADDLE_MODEL_TYPES = ("paddleocr_vl",)
PADDLE_ARCHITECTURE = "PaddleOCRVLForConditionalGeneration"


@dataclass(frozen=True)
class VisionShape:
    weight_bytes: int
    image_size: int  # the square side the tower takes
    patch_size: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    source: str  # where the tower's weights are: the mmproj file's name, or the folder's safetensors
    max_patches: int | None = None  # a tower taking any image size (Qwen-VL): patches of its largest image

    @property
    def patches(self) -> int:
        if self.max_patches is not None:
            return self.max_patches
        return (self.image_size // self.patch_size) ** 2

    def activation_bytes(self) -> int:
        n = self.patches
        scores = n * n  # one head's, softmaxed in place
        layer = n * (6 * self.hidden_size + 2 * self.intermediate_size)
        return (scores + layer) * FLOAT_BYTES


def _clip_key(meta: Mapping[str, Any], source: str, name: str) -> int:
    value = meta.get(f"clip.vision.{name}")
    if value is None:
        raise ValueError(f"{source} lacks clip.vision.{name}: cannot size its vision tower")
    return int(value)


def vision_from_mmproj(meta: Mapping[str, Any], weight_bytes: int, source: str) -> VisionShape:
    """From an mmproj GGUF's `clip.vision.*` keys (ValueError naming a missing key)."""
    from app.engine.models.vision.muse_glimmer_mmproj import MAX_IMAGE_TOKENS as MUSE_GLIMMER_MAX_TOKENS
    from app.engine.models.vision.muse_glimmer_mmproj import PROJECTOR as MUSE_GLIMMER_PROJECTOR
    from app.engine.models.vision.paddleocr_mmproj import PROJECTOR as PADDLE_PROJECTOR
    from app.engine.models.vision.qwen_vl_mmproj import PROJECTOR, projector_type, qwen_config_from_gguf

    if projector_type(meta) == PADDLE_PROJECTOR:
        return _paddle_from_mmproj(meta, weight_bytes, source)
    if projector_type(meta) == PROJECTOR:
        # its image_size key is a converter placeholder: the tower is sized by its max_pixels; the
        # projection width is checked against the text model at load, not here (no model at hand)
        config = qwen_config_from_gguf(dict(meta), int(meta.get("clip.vision.projection_dim", 0)))
        return _any_size_shape(config, config.max_pixels // config.patch_size**2, weight_bytes, source)
    if projector_type(meta) == GEMMA4_PROJECTOR:
        return _gemma4_mmproj_shape(meta, weight_bytes, source)

    max_patches = None
    if projector_type(meta) == MUSE_GLIMMER_PROJECTOR:  # image_size is nominal: sized at its largest image
        merge = int(meta.get("clip.vision.spatial_merge_size", 2))
        max_patches = MUSE_GLIMMER_MAX_TOKENS * merge * merge
    return VisionShape(
        weight_bytes=int(weight_bytes),
        image_size=_clip_key(meta, source, "image_size"),
        patch_size=_clip_key(meta, source, "patch_size"),
        hidden_size=_clip_key(meta, source, "embedding_length"),
        num_heads=_clip_key(meta, source, "attention.head_count"),
        intermediate_size=_clip_key(meta, source, "feed_forward_length"),
        source=source,
        max_patches=max_patches,
    )


def _paddle_from_mmproj(meta: Mapping[str, Any], weight_bytes: int, source: str) -> VisionShape:
    """A PaddleOCR-VL mmproj: its image_size key holds sqrt(max_pixels); the bound itself sizes it."""
    patch = _clip_key(meta, source, "patch_size")
    fields = SimpleNamespace(
        patch_size=patch,
        hidden_size=_clip_key(meta, source, "embedding_length"),
        num_heads=_clip_key(meta, source, "attention.head_count"),
        intermediate_size=_clip_key(meta, source, "feed_forward_length"),
    )
    return _any_size_shape(fields, _clip_key(meta, source, "image_max_pixels") // patch**2, weight_bytes, source)


def _any_size_shape(config: Any, max_patches: int, weight_bytes: int, source: str) -> VisionShape:
    """A tower that takes any image size (Qwen2.5-VL's QwenVisionConfig, Gemma 4's Gemma4VisionConfig,
    PaddleOCR-VL's PaddleVisionConfig, or the same fields from an mmproj), sized at its largest image's
    patches."""
    return VisionShape(
        weight_bytes=int(weight_bytes),
        image_size=0,
        patch_size=config.patch_size,
        hidden_size=config.hidden_size,
        num_heads=config.num_heads,
        intermediate_size=config.intermediate_size,
        source=source,
        max_patches=max_patches,
    )


def _gemma4_mmproj_shape(meta: Mapping[str, Any], weight_bytes: int, source: str) -> VisionShape:
    """A gemma4v mmproj's tower at its soft-token budget (models/vision/gemma4_mmproj.py's defaults:
    3x3 pooling, 280 tokens, unless the file says otherwise)."""
    from app.engine.models.vision.gemma4_mmproj import DEFAULT_POOLING, DEFAULT_SOFT_TOKENS

    patch = _clip_key(meta, source, "patch_size")
    pooling = int(meta.get("clip.vision.projector.scale_factor", DEFAULT_POOLING))
    max_pixels = meta.get("clip.vision.image_max_pixels")
    tokens = int(max_pixels) // (patch * pooling) ** 2 if max_pixels else DEFAULT_SOFT_TOKENS
    fields = SimpleNamespace(
        patch_size=patch,
        hidden_size=_clip_key(meta, source, "embedding_length"),
        num_heads=_clip_key(meta, source, "attention.head_count"),
        intermediate_size=_clip_key(meta, source, "feed_forward_length"),
    )
    return _any_size_shape(fields, tokens * pooling**2, weight_bytes, source)


def vision_from_hf_config(
    config: Mapping[str, Any], weight_bytes: int, source: str, processor: Mapping[str, Any] | None = None
) -> VisionShape | None:
    """From config.json's vision_config (SigLIP's defaults for what it leaves out; Qwen2.5-VL's own
    config, with preprocessor_config.json's pixel bounds when given); None without one."""
    from app.engine.models.vision.config import SIGLIP_DEFAULTS

    if not config.get("vision_config"):  # absent, or null (a Gemma 4 without vision)
        return None
    if config.get("model_type") in QWEN_VL_MODEL_TYPES or QWEN_VL_ARCHITECTURE in (
        config.get("architectures") or ()
    ):
        from app.engine.models.vision.qwen_vl_config import qwen_vision_config

        qwen = qwen_vision_config(dict(config), processor)
        return _any_size_shape(qwen, qwen.max_pixels // qwen.patch_size**2, weight_bytes, source)
    if config.get("model_type") in PADDLE_MODEL_TYPES or PADDLE_ARCHITECTURE in (
        config.get("architectures") or ()
    ):
        from app.engine.models.vision.paddleocr_config import paddle_vision_config

        paddle = paddle_vision_config(dict(config), processor)
        return _any_size_shape(paddle, paddle.max_pixels // paddle.patch_size**2, weight_bytes, source)
    if GEMMA4_ARCHITECTURE in (config.get("architectures") or ()):
        from app.engine.models.vision.gemma4_config import gemma4_vision_config

        gemma4 = gemma4_vision_config(dict(config), dict(processor or {}))
        return _any_size_shape(gemma4, gemma4.max_patches, weight_bytes, source)
    if config.get("model_type") == MUSE_GLIMMER_MODEL_TYPE or MUSE_GLIMMER_ARCHITECTURE in (
        config.get("architectures") or ()
    ):
        from app.engine.models.vision.muse_glimmer_config import muse_glimmer_vision_config

        muse = muse_glimmer_vision_config(dict(config), dict(processor or {}))
        return VisionShape(
            weight_bytes=int(weight_bytes),
            image_size=0,
            patch_size=muse.patch_size,
            hidden_size=muse.hidden_size,
            num_heads=muse.num_heads,
            intermediate_size=muse.intermediate_size,
            source=source,
            max_patches=muse.max_image_tokens * muse.merge_unit,
        )
    vision = {**SIGLIP_DEFAULTS, **(config.get("vision_config") or {})}
    return VisionShape(
        weight_bytes=int(weight_bytes),
        image_size=int(vision["image_size"]),
        patch_size=int(vision["patch_size"]),
        hidden_size=int(vision["hidden_size"]),
        num_heads=int(vision["num_attention_heads"]),
        intermediate_size=int(vision["intermediate_size"]),
        source=source,
    )


def takes_images(architecture: str) -> bool:
    return architecture in VISION_ARCHITECTURES


def is_vision_tensor(hf_name: str) -> bool:
    """A Hugging Face tensor of the vision side (tower or projector), by its name."""
    name = hf_name.removeprefix("model.")
    paddle_projector = hf_name.startswith(("mlp_AR.", "model.projector."))  # PaddleOCR-VL's, both layouts
    return paddle_projector or name.startswith(
        ("vision_tower.", "multi_modal_projector.", "visual.", "vision_adapter.", "vision_projection.")
    )


def is_mmproj_name(name: str) -> bool:
    """A GGUF file that is a vision projector, not a model: the loader's rule (find_mmproj)."""
    return name.lower().endswith(".gguf") and "mmproj" in name.lower()


def mmproj_beside(model_path: str | Path) -> Path | None:
    """The mmproj GGUF the loader would use for this text GGUF (CheckpointError when it is ambiguous)."""
    from app.engine.models.vision.weights import find_mmproj

    return find_mmproj(Path(model_path))


def vision_of_mmproj_file(path: str | Path) -> VisionShape | None:
    """An mmproj file's tower, from its header and tensor table (memory-mapped: no weights are read);
    its audio half, if any, is not the vision tower's; None for an mmproj without vision."""
    from app.engine.loader.gguf import read_gguf

    path = Path(path)
    file = read_gguf(path)
    meta = file.metadata
    if meta.get("clip.has_audio_encoder") and not meta.get("clip.has_vision_encoder"):
        return None  # an audio-only mmproj (audio_fit.py counts it)
    weight_bytes = sum(t.nbytes for name, t in file.tensors.items() if not is_audio_gguf_tensor(name))
    return vision_from_mmproj(file.metadata, weight_bytes, path.name)


def vision_beside_gguf(model_path: str | Path, architecture: str) -> VisionShape | None:
    """The tower the engine would load beside this text GGUF, or None."""
    if not takes_images(architecture):
        return None
    found = mmproj_beside(model_path)
    return vision_of_mmproj_file(found) if found is not None else None
