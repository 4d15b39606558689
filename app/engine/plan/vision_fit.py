"""The vision tower's share of will-it-fit: its weights as stored, and its working set to encode one image.

The tower is found as the loader finds it (models/vision): an mmproj GGUF beside a text GGUF
(`find_mmproj`), or the `vision_tower.*` / `multi_modal_projector.*` tensors of a Hugging Face
folder whose config.json has a vision_config. Only families the engine gives vision to count one.

SigLIP attends every patch to every patch with no KV cache, one head at a time with the softmax in
place (models/vision/siglip.py `full_attention`): per image, patches^2 float32 scores, beside one
layer's activations, patches x (6 x hidden + 2 x ff) floats (residual, normed copy, q, k, v,
attention output; MLP up and its activation). Images are encoded one view at a time. Qwen2.5-VL's
tower takes images of any size up to its max_pixels, and its full-attention layers attend over all
of an image's patches: it is sized at that largest image.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.engine.images import VISION_ARCHITECTURES
from app.engine.plan.audio_fit import is_audio_gguf_tensor

FLOAT_BYTES = 4
# config.json's names for the Qwen towers the engine runs (the rest of a vision_config is SigLIP's)
QWEN_VL_MODEL_TYPES = ("qwen2_5_vl",)
QWEN_VL_ARCHITECTURE = "Qwen2_5_VLForConditionalGeneration"


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


def vision_from_mmproj(meta: Mapping[str, Any], weight_bytes: int, source: str) -> VisionShape:
    """From an mmproj GGUF's `clip.vision.*` keys (ValueError naming a missing key)."""
    from app.engine.models.vision.qwen_vl_mmproj import PROJECTOR, projector_type, qwen_config_from_gguf

    if projector_type(meta) == PROJECTOR:
        # its image_size key is a converter placeholder: the tower is sized by its max_pixels; the
        # projection width is checked against the text model at load, not here (no model at hand)
        config = qwen_config_from_gguf(dict(meta), int(meta.get("clip.vision.projection_dim", 0)))
        return _qwen_shape(config, weight_bytes, source)

    def key(name: str) -> int:
        value = meta.get(f"clip.vision.{name}")
        if value is None:
            raise ValueError(f"{source} lacks clip.vision.{name}: cannot size its vision tower")
        return int(value)

    return VisionShape(
        weight_bytes=int(weight_bytes),
        image_size=key("image_size"),
        patch_size=key("patch_size"),
        hidden_size=key("embedding_length"),
        num_heads=key("attention.head_count"),
        intermediate_size=key("feed_forward_length"),
        source=source,
    )


def _qwen_shape(config: Any, weight_bytes: int, source: str) -> VisionShape:
    """A Qwen2.5-VL tower (models/vision/qwen_vl_config.QwenVisionConfig), sized at its largest image."""
    return VisionShape(
        weight_bytes=int(weight_bytes),
        image_size=0,
        patch_size=config.patch_size,
        hidden_size=config.hidden_size,
        num_heads=config.num_heads,
        intermediate_size=config.intermediate_size,
        source=source,
        max_patches=config.max_pixels // config.patch_size**2,
    )


def vision_from_hf_config(
    config: Mapping[str, Any], weight_bytes: int, source: str, processor: Mapping[str, Any] | None = None
) -> VisionShape | None:
    """From config.json's vision_config (SigLIP's defaults for what it leaves out; Qwen2.5-VL's own
    config, with preprocessor_config.json's pixel bounds when given); None without one."""
    from app.engine.models.vision.config import SIGLIP_DEFAULTS

    if not config.get("vision_config"):  # absent, or null (a Gemma 4 without vision)
        return None
    if config.get("model_type") in QWEN_VL_MODEL_TYPES or QWEN_VL_ARCHITECTURE in (config.get("architectures") or ()):
        from app.engine.models.vision.qwen_vl_config import qwen_vision_config

        return _qwen_shape(qwen_vision_config(dict(config), processor), weight_bytes, source)
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
    return name.startswith(("vision_tower.", "multi_modal_projector.", "visual."))


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
