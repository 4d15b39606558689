"""Pages into PaddleOCR-VL's patches and prompts, as Hugging Face's PaddleOCRVLImageProcessorPil and
PaddleOCRVLProcessor make them.

Resize: Qwen2-VL's `smart_resize` (sides multiples of one merged patch, 28 px; pixels within
min/max_pixels; aspect kept) after one step of its own: a side under 28 px is first raised to 28 with
the other scaled to match, so a thin strip of text keeps its proportions instead of being refused.
Then PIL bicubic, rescale and normalize (as Gemma's), and patches in raster order (not Qwen's
merge-block order: the projector merges), each flattened as (c, y, x), the conv weight's order.

The chat template writes `<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>` for an image part; the
processor repeats the placeholder once per merged patch (h*w/4), and the text is tokenized whole.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from app.engine.models.vision.image_processing import resize_normalize, to_rgb
from app.engine.models.vision.paddleocr_config import PaddleVisionConfig
from app.engine.models.vision.qwen_vl_processing import smart_resize
from app.engine.models.vision.qwen_vl_prompter import QwenImagePrompter

START, END, PAD = "<|IMAGE_START|>", "<|IMAGE_END|>", "<|IMAGE_PLACEHOLDER|>"


def paddle_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Target `(height, width)` as PaddleOCR-VL's processor computes it (Python's round: half to even)."""
    if height < factor:
        width, height = round(width * factor / height), factor
    if width < factor:
        height, width = round(height * factor / width), factor
    return smart_resize(height, width, factor, min_pixels, max_pixels)


def patchify(pixels: np.ndarray, patch: int) -> tuple[np.ndarray, tuple[int, int, int]]:
    """`[C, H, W]` normalized -> `([h*w, C*p*p], (1, h, w))`, patches in raster order."""
    c, height, width = pixels.shape
    gh, gw = height // patch, width // patch
    grid = pixels.reshape(c, gh, patch, gw, patch).transpose(1, 3, 0, 2, 4)
    return np.ascontiguousarray(grid.reshape(gh * gw, c * patch * patch), np.float32), (1, gh, gw)


def preprocess_paddle(image: Image.Image, cfg: PaddleVisionConfig) -> tuple[np.ndarray, tuple[int, int, int]]:
    """Patches and grid of one page for the tower."""
    array = np.asarray(to_rgb(image)).transpose(2, 0, 1)  # [3, H, W] uint8
    height, width = paddle_resize(array.shape[1], array.shape[2], cfg.factor, cfg.min_pixels, cfg.max_pixels)
    pixels = resize_normalize(
        array, height, width, cfg.resample, cfg.rescale_factor, cfg.image_mean, cfg.image_std
    )
    return patchify(pixels, cfg.patch_size)


class PaddleImagePrompter(QwenImagePrompter):
    """Qwen's prompter (one placeholder token per merged patch, between a start and an end token)
    with PaddleOCR-VL's tokens and preprocessing."""

    tokens = (START, END, PAD)
    placeholder = f"{START}{PAD}{END}"

    @staticmethod
    def preprocess(image: Image.Image, cfg: PaddleVisionConfig) -> tuple[np.ndarray, tuple[int, int, int]]:
        return preprocess_paddle(image, cfg)
