"""Vision towers: images to the text model's input embeddings.

`VisionModel` = SigLIP encoder + Gemma 3 projector over backend ops, `QwenVisionModel` the
Qwen2.5-VL vision transformer and merger (qwen_vl.py); `load_vision` builds the checkpoint's
from a Hugging Face folder or a llama.cpp mmproj GGUF (see weights.py, qwen_vl_mmproj.py);
Gemma 4's tower and embedder are `Gemma4VisionTower` (gemma4_vision.py, from an HF folder or a gemma4v
mmproj: gemma4_mmproj.py);
Muse Glimmer's tower, adapter and projection `MuseGlimmerVisionTower` (muse_glimmer_vision.py, from an HF
folder or an mmproj: muse_glimmer_weights.py, muse_glimmer_mmproj.py);
PaddleOCR-VL's tower and projector `PaddleVisionTower` (paddleocr_vision.py);
image preprocessing is in image_processing.py, qwen_vl_processing.py, gemma4_processing.py and
paddleocr_processing.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from app.engine.images import ImageInput
from app.engine.loader.names import CheckpointError
from app.engine.models.vision.config import VisionConfig
from app.engine.models.vision.gemma3_projector import Gemma3Projector
from app.engine.models.vision.gemma4_config import load_gemma4_vision
from app.engine.models.vision.gemma4_mmproj import load_gemma4_mmproj
from app.engine.models.vision.gemma4_vision import Gemma4VisionTower
from app.engine.models.vision.muse_glimmer_vision import MuseGlimmerVisionTower
from app.engine.models.vision.muse_glimmer_weights import load_muse_glimmer_tower
from app.engine.models.vision.paddleocr_config import load_paddle_vision
from app.engine.models.vision.paddleocr_mmproj import load_paddle_mmproj
from app.engine.models.vision.paddleocr_vision import PaddleVisionTower
from app.engine.models.vision.qwen_vl import QwenVisionModel
from app.engine.models.vision.qwen_vl_mmproj import load_qwen_mmproj
from app.engine.models.vision.qwen_vl_weights import load_qwen_vision
from app.engine.models.vision.siglip import SiglipEncoder
from app.engine.models.vision.weights import Tensors, find_mmproj, load_hf_vision, load_mmproj

__all__ = [
    "Gemma4VisionTower",
    "MuseGlimmerVisionTower",
    "PaddleVisionTower",
    "QwenVisionModel",
    "VisionConfig",
    "VisionModel",
    "load_vision",
]


class VisionModel:
    def __init__(self, backend: Any, cfg: VisionConfig, tensors: Tensors) -> None:
        self.backend, self.config = backend, cfg
        self.encoder = SiglipEncoder(backend, cfg, tensors)
        self.projector = Gemma3Projector(backend, cfg, tensors)

    def encode(self, pixels: np.ndarray) -> Any:
        """Normalized pixel values `[3, S, S]` -> soft-token embeddings `[tokens_per_image, text hidden]`."""
        return self.projector(self.encoder(pixels))

    def encode_image(self, image: ImageInput) -> Any:
        return self.encode(image.pixel_values)


def load_vision(
    checkpoint: Any, backend: Any, mmproj: str | Path | None = None
) -> VisionModel | QwenVisionModel | Gemma4VisionTower | MuseGlimmerVisionTower | PaddleVisionTower | None:
    """The checkpoint's vision tower: its own (HF folder), the given mmproj, or an mmproj beside a
    GGUF. None when the model has none."""
    if checkpoint.architecture == "qwen2vl":
        return _load_qwen(checkpoint, backend, mmproj)
    if checkpoint.architecture == "gemma4":
        return _load_gemma4(checkpoint, backend, mmproj)
    if checkpoint.architecture == "muse-glimmer":
        return load_muse_glimmer_tower(checkpoint, backend, mmproj)
    if checkpoint.architecture == "paddleocr":
        return _load_paddle(checkpoint, backend, mmproj)
    text_hidden = checkpoint.tensors["token_embd.weight"].shape[1]
    if mmproj is not None:
        cfg, tensors = load_mmproj(Path(mmproj), text_hidden)
    elif checkpoint.format == "gguf":
        found = find_mmproj(checkpoint.path)
        if found is None:
            return None
        cfg, tensors = load_mmproj(found, text_hidden)
    else:
        loaded = load_hf_vision(checkpoint.path, checkpoint.hf_config or {})
        if loaded is None:
            return None
        cfg, tensors = loaded
    return VisionModel(backend, cfg, tensors)


def _load_qwen(checkpoint: Any, backend: Any, mmproj: str | Path | None) -> QwenVisionModel | None:
    """From the given mmproj, the mmproj beside a GGUF, or the folder's own `visual.*` tensors."""
    loaded = _mmproj_or_folder(checkpoint, mmproj, load_qwen_mmproj, load_qwen_vision)
    if loaded is None:
        return None
    cfg, tensors = loaded
    _check_width(checkpoint, cfg.out_hidden_size, "merger")
    return QwenVisionModel(backend, cfg, tensors)


def _mmproj_or_folder(checkpoint: Any, mmproj: str | Path | None, from_mmproj: Any, from_folder: Any) -> Any:
    """`(config, tensors)` of a tower given as an mmproj, found beside a GGUF, or in the HF folder
    (None where there is none): the M-RoPE families' towers load alike."""
    if mmproj is not None or checkpoint.format == "gguf":
        path = Path(mmproj) if mmproj is not None else find_mmproj(checkpoint.path)
        if path is None:
            return None
        return from_mmproj(path, checkpoint.tensors["token_embd.weight"].shape[1])
    return from_folder(checkpoint.path, checkpoint.hf_config or {})


def _check_width(checkpoint: Any, width: int, part: str) -> None:
    text_hidden = checkpoint.tensors["token_embd.weight"].shape[1]
    if width != text_hidden:
        raise CheckpointError(
            f"{checkpoint.path}: the vision {part} outputs width {width}, the text model's is {text_hidden}"
        )


def _load_gemma4(checkpoint: Any, backend: Any, mmproj: str | Path | None) -> Gemma4VisionTower | None:
    """From the given mmproj, the mmproj beside a GGUF, or the folder's own `vision_tower.*`/`embed_vision.*`
    tensors. Whether image tokens attend both ways in the text model: the folder's config says
    (`use_bidirectional_attention`); a GGUF does not, and llama.cpp's rule stands in: all but the E-series
    (the models with per-layer inputs) do."""
    text_hidden = checkpoint.tensors["token_embd.weight"].shape[1]
    path = Path(mmproj) if mmproj is not None else None
    if path is None and checkpoint.format == "gguf":
        path = find_mmproj(checkpoint.path)
        if path is None:
            return None
    if path is not None:
        text_config = (checkpoint.hf_config or {}).get("text_config")
        if text_config is not None:
            two_way = text_config.get("use_bidirectional_attention") == "vision"
        else:
            two_way = "per_layer_token_embd.weight" not in checkpoint.tensors
        loaded = load_gemma4_mmproj(path, text_hidden, two_way)
        return None if loaded is None else Gemma4VisionTower(backend, *loaded)
    loaded = load_gemma4_vision(checkpoint.path, checkpoint.hf_config or {})
    if loaded is None:
        return None
    cfg, tensors = loaded
    if cfg.text_hidden_size != text_hidden:
        raise CheckpointError(
            f"{checkpoint.path}: the vision embedder outputs width {cfg.text_hidden_size}, the text model's is {text_hidden}"
        )
    return Gemma4VisionTower(backend, cfg, tensors)


def _load_paddle(checkpoint: Any, backend: Any, mmproj: str | Path | None) -> PaddleVisionTower | None:
    """From the given mmproj, the mmproj beside a GGUF, or the folder's own `visual.*`/`mlp_AR.*`."""
    loaded = _mmproj_or_folder(checkpoint, mmproj, load_paddle_mmproj, load_paddle_vision)
    if loaded is None:
        return None
    cfg, tensors = loaded
    _check_width(checkpoint, cfg.text_hidden_size, "projector")
    return PaddleVisionTower(backend, cfg, tensors)
