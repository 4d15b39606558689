"""Images into Gemma 4's patches, as transformers' Gemma4ImageProcessorPil makes them, and its prompts.

Steps, in its order: decode (as image_processing.decode_image), an aspect-ratio-preserving resize to
the largest sides that are multiples of `k * patch` (k the pooling kernel) and give at most
`max_soft_tokens * k^2` patches, PIL resample, rescale to [0, 1] (no normalization), then patchify:
patches row-major, each flattened as (y, x, c). The HF processor pads to its budget with positions
(-1, -1); the tower drops padding, so none is made here and the grid travels as `grid_thw` (1, h, w).

Gemma 4's chat template writes `<|image|>` where an image part sits; its processor replaces each by
`<|image>` + one `<|image|>` per soft token + `<image|>`, and the text is tokenized whole, specials
parsed. `Gemma4ImagePrompter.expand` (prompter.ImagePrompter's) does the same.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image

from app.engine.images import ImageInput
from app.engine.models.vision.gemma4_config import Gemma4VisionConfig
from app.engine.models.vision.image_processing import (
    MAX_IMAGE_PIXELS,
    ImageError,
    decode_image,
    resize_normalize,
    to_rgb,
)
from app.engine.models.vision.prompter import ImagePrompter, PreparedImage, image_token_ids

BOI, EOI, SOFT = "<|image>", "<image|>", "<|image|>"


def target_size(height: int, width: int, cfg: Gemma4VisionConfig) -> tuple[int, int]:
    """transformers' get_aspect_ratio_preserving_size, its arithmetic exactly; ImageError where the
    image cannot fit a grid (too long and thin)."""
    p, k = cfg.patch_size, cfg.pooling_kernel_size
    target_px = cfg.max_patches * p * p
    factor = math.sqrt(target_px / (height * width))
    side = k * p
    th, tw = math.floor(factor * height / side) * side, math.floor(factor * width / side) * side
    if th == 0 and tw == 0:
        raise ImageError(f"image is {width}x{height} pixels: it resizes to nothing")
    longest = (cfg.max_patches // k**2) * side
    if th == 0:
        th, tw = side, min(math.floor(width / height) * side, longest)
    elif tw == 0:
        th, tw = min(math.floor(height / width) * side, longest), side
    if th * tw > target_px:
        raise ImageError(
            f"image is {width}x{height} pixels: its aspect ratio is too extreme for {cfg.max_patches} patches"
        )
    return th, tw


def patchify(pixels: np.ndarray, patch: int) -> tuple[np.ndarray, tuple[int, int, int]]:
    """`[C, H, W]` -> `([h*w, p*p*C], (1, h, w))`: row-major patches flattened as (y, x, c)."""
    c, height, width = pixels.shape
    gh, gw = height // patch, width // patch
    grid = pixels.reshape(c, gh, patch, gw, patch).transpose(1, 3, 2, 4, 0)
    return np.ascontiguousarray(grid.reshape(gh * gw, -1), np.float32), (1, gh, gw)


def preprocess_gemma4(image: Image.Image, cfg: Gemma4VisionConfig) -> tuple[np.ndarray, tuple[int, int, int]]:
    """Patches in [0, 1] and the patch grid of one image."""
    array = np.asarray(to_rgb(image)).transpose(2, 0, 1)  # [3, H, W] uint8
    height, width = target_size(array.shape[1], array.shape[2], cfg)
    pixels = resize_normalize(array, height, width, cfg.resample, cfg.rescale_factor, (0.0,) * 3, (1.0,) * 3)
    return patchify(pixels, cfg.patch_size)


def grid_positions(grid_thw: tuple[int, int, int]) -> np.ndarray:
    """(x, y) of each patch of a row-major `(1, h, w)` grid, as the processor's position ids."""
    _, h, w = grid_thw
    ys, xs = np.divmod(np.arange(h * w), w)
    return np.stack([xs, ys], axis=1)


class Gemma4ImagePrompter(ImagePrompter):
    placeholder = SOFT  # what the chat template writes for an image part

    def __init__(self, cfg: Gemma4VisionConfig, tokenizer, max_pixels: int = MAX_IMAGE_PIXELS) -> None:
        self.config = cfg
        self.image_token_id: int = image_token_ids(tokenizer, (BOI, EOI, SOFT))[SOFT]
        self.max_pixels = max_pixels

    def tokens_for(self, image: ImageInput) -> int:
        """One soft token per k x k cell of the image's patch grid."""
        if image.grid_thw is None:
            raise ValueError("a Gemma 4 image needs its patch grid")
        _, h, w = image.grid_thw
        return h * w // self.config.pooling_kernel_size**2

    def prepare(self, data: bytes) -> PreparedImage:
        """Decode and preprocess one image (ImageError naming what is wrong)."""
        patches, grid = preprocess_gemma4(decode_image(data, self.max_pixels), self.config)
        return PreparedImage((ImageInput(patches, grid_thw=grid),))

    def expansion(self, image: PreparedImage) -> str:
        return f"{BOI}{SOFT * self.tokens_for(image.views[0])}{EOI}"
