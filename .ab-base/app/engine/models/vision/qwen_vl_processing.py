"""Images into Qwen2.5-VL's patches, as Hugging Face's Qwen2VLImageProcessor (PIL backend) makes them.

Steps, in its order: decode (as image_processing.decode_image), `smart_resize` to sides that are
multiples of one merged patch (28 px) with the pixel count within min/max pixels and the aspect
ratio kept as closely as that allows, PIL bicubic resize, rescale and normalize (as Gemma's), then
patchify: the single frame repeated over the temporal patch, patches ordered merge block by merge
block (the 2x2 patches that merge into one token are adjacent), each flattened as (c, t, y, x),
the order of the Conv3d weight `[out, C, T, p, p]`. The tests hold the values and grids to the HF
processor's on odd sizes and aspect ratios.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image

from app.engine.models.vision.image_processing import ImageError, resize_normalize, to_rgb
from app.engine.models.vision.qwen_vl_config import QwenVisionConfig

MAX_ASPECT_RATIO = 200  # the HF processor refuses longer images


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Target `(height, width)`: multiples of `factor`, `min_pixels <= h * w <= max_pixels` (as far as
    whole factors allow), aspect ratio kept. transformers' arithmetic exactly (Python's round: half to even)."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ImageError(
            f"image is {width}x{height} pixels: its aspect ratio is over {MAX_ASPECT_RATIO}, which the model cannot take"
        )
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def patchify(pixels: np.ndarray, cfg: QwenVisionConfig) -> tuple[np.ndarray, tuple[int, int, int]]:
    """`[C, H, W]` normalized -> `([h*w, C*T*p*p], (1, h, w))` in Qwen2VLImageProcessor's order."""
    c, height, width = pixels.shape
    p, m, t = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    gh, gw = height // p, width // p
    grid = pixels.reshape(c, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
    frames = np.broadcast_to(grid[:, :, :, :, :, None], (*grid.shape[:5], t, *grid.shape[5:]))
    return np.ascontiguousarray(frames.reshape(gh * gw, c * t * p * p), np.float32), (1, gh, gw)


def preprocess_qwen(image: Image.Image, cfg: QwenVisionConfig) -> tuple[np.ndarray, tuple[int, int, int]]:
    """Patches and grid of one image for the tower."""
    array = np.asarray(to_rgb(image)).transpose(2, 0, 1)  # [3, H, W] uint8
    height, width = smart_resize(array.shape[1], array.shape[2], cfg.factor, cfg.min_pixels, cfg.max_pixels)
    pixels = resize_normalize(
        array, height, width, cfg.resample, cfg.rescale_factor, cfg.image_mean, cfg.image_std
    )
    return patchify(pixels, cfg)
