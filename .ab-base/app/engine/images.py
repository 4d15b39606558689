"""An image as the engine takes it: one view's normalized pixel values and its content key.

A leaf (numpy only), like request.py: `GenerationRequest` carries these, `Request` places each
over its run of image tokens, the prefix cache keys those tokens by `key`, and the runner's
image embedder encodes each key once.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

VISION_ARCHITECTURES = ("gemma3", "gemma4", "muse-glimmer", "qwen2vl", "paddleocr")  # the families the engine gives a vision tower


@dataclass(frozen=True)
class ImageInput:
    pixel_values: np.ndarray = field(repr=False)  # float32, as the tower takes it: [3, S, S] (Gemma 3)
    key: str = ""  # content hash of the pixel values (and grid); "" -> computed
    # Qwen2.5-VL: the pixel values are patches `[t*h*w, C*T*p*p]` of a grid of (t, h, w) patches;
    # Gemma 4: patches `[h*w, p*p*C]` of a (1, h, w) grid; Muse Glimmer: `[h*w, T*C*p*p]`, row-major;
    # PaddleOCR-VL: `[h*w, C*p*p]`, raster order
    grid_thw: tuple[int, int, int] | None = None
    # "audio": a clip's log-mel frames `[frames, bins]` (Gemma 4) or `[bins, frames]` (Qwen3-ASR), placed
    # over the audio token's runs and encoded by the audio tower; "image" everything else
    modality: str = "image"

    def __post_init__(self) -> None:
        if not self.key:
            digest = hashlib.blake2b(np.ascontiguousarray(self.pixel_values).tobytes(), digest_size=16)
            if self.grid_thw is not None:  # the same patches in another grid are another image
                digest.update(np.asarray(self.grid_thw, np.int64).tobytes())
            if self.modality != "image":
                digest.update(self.modality.encode())
            object.__setattr__(self, "key", digest.hexdigest())

    @property
    def cache_id(self) -> int:
        """The stand-in token id of this image's tokens in prefix-cache keys: negative (no real
        token id is), below the request's PLACEHOLDER (-1), distinct per image content."""
        return -2 - int(self.key[:15], 16)


@dataclass(frozen=True)
class PromptImage:
    """An image over prompt positions `[start, end)` (its run of soft tokens)."""

    start: int
    end: int
    image: ImageInput
