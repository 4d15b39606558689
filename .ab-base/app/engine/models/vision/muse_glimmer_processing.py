"""Images into Muse Glimmer's patches, as transformers' MuseGlimmerImageProcessor makes them, and its prompts.

Steps, in its order: decode (as image_processing.decode_image), `smart_resize` to the whole merged-patch grid
(28 px cells by default) closest to the image's aspect ratio with at most `max_image_tokens` cells, LANCZOS
resize (PIL's; the HF processor asks torchvision for the same kernel, llama.cpp's mtmd uses it too), rescale
and normalize (mean = std = 0.5), then patchify: patches row-major (not in merge blocks: the tower merges
after its pixel shuffle), each flattened as (t, c, y, x) with the one frame repeated over the temporal patch.
An image so thin that no grid fits the cap (transformers then rounds to a grid over it) is refused instead.

Muse Glimmer's processor replaces each `<|patch|>` the chat template writes for an image by
`<|image_start|>` + one `<|patch|>` per merged 2x2 cell + `<|image_end|>`, and the text is tokenized
whole, specials parsed. `MuseGlimmerImagePrompter.expand` (prompter.ImagePrompter's) does the same. The
text model places the image tokens like any others: causal attention, plain 1D positions.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from PIL import Image

from app.engine.images import ImageInput
from app.engine.models.vision.image_processing import (
    MAX_IMAGE_PIXELS,
    ImageError,
    decode_image,
    resize_normalize,
    to_rgb,
)
from app.engine.models.vision.muse_glimmer_config import MuseGlimmerVisionConfig
from app.engine.models.vision.prompter import ImagePrompter, PreparedImage, image_token_ids

START, END, PATCH = "<|image_start|>", "<|image_end|>", "<|patch|>"


def smart_resize(height: int, width: int, cell: int, max_tokens: int) -> tuple[int, int]:
    """Target `(height, width)` in pixels: the grid of `cell`-pixel cells nearest the image's aspect ratio
    with at most `max_tokens` cells. transformers' arithmetic exactly (its candidates and tie order)."""
    ideal_h, ideal_w = height / cell, width / cell
    ratio = ideal_w / ideal_h if ideal_h > 0 else 1.0
    if ideal_h * ideal_w > max_tokens:
        ideal_h = (max_tokens / ratio) ** 0.5
        ideal_w = ideal_h * ratio
    # transformers picks among a set's candidates: min over the set's iteration order breaks ties
    candidates = list(
        set(itertools.product([math.floor(ideal_h), math.ceil(ideal_h)], [math.floor(ideal_w), math.ceil(ideal_w)]))
    )
    candidates = [(h, w) for h, w in candidates if h >= 1 and w >= 1 and h * w <= max_tokens]
    if not candidates:
        candidates = [(max(1, round(ideal_h)), max(1, round(ideal_w)))]
    h, w = min(candidates, key=lambda grid: abs(grid[0] / grid[1] - height / width))
    return h * cell, w * cell


def patchify(pixels: np.ndarray, patch: int, temporal: int) -> tuple[np.ndarray, tuple[int, int, int]]:
    """`[C, H, W]` normalized -> `([h*w, T*C*p*p], (1, h, w))`: row-major patches as (t, c, y, x)."""
    c, height, width = pixels.shape
    gh, gw = height // patch, width // patch
    grid = pixels.reshape(c, gh, patch, gw, patch).transpose(1, 3, 0, 2, 4).reshape(gh * gw, 1, -1)
    frames = np.broadcast_to(grid, (gh * gw, temporal, grid.shape[-1]))
    return np.ascontiguousarray(frames.reshape(gh * gw, -1), np.float32), (1, gh, gw)


def preprocess_muse_glimmer(
    image: Image.Image, cfg: MuseGlimmerVisionConfig
) -> tuple[np.ndarray, tuple[int, int, int]]:
    """Patches and grid of one image for the tower."""
    array = np.asarray(to_rgb(image)).transpose(2, 0, 1)  # [3, H, W] uint8
    height, width = smart_resize(array.shape[1], array.shape[2], cfg.factor, cfg.max_image_tokens)
    cells = (height // cfg.factor) * (width // cfg.factor)
    if cells > cfg.max_image_tokens:  # transformers would go over its cap (a thin image's fallback grid)
        raise ImageError(
            f"image is {array.shape[2]}x{array.shape[1]} pixels: its aspect ratio is too extreme for "
            f"{cfg.max_image_tokens} image tokens (it would take {cells})"
        )
    pixels = resize_normalize(array, height, width, cfg.resample, cfg.rescale_factor, cfg.image_mean, cfg.image_std)
    return patchify(pixels, cfg.patch_size, cfg.temporal_patch_size)


class MuseGlimmerImagePrompter(ImagePrompter):
    placeholder = PATCH  # what the chat template writes for an image part

    def __init__(self, cfg: MuseGlimmerVisionConfig, tokenizer, max_pixels: int = MAX_IMAGE_PIXELS) -> None:
        self.config = cfg
        self.image_token_id: int = image_token_ids(tokenizer, (START, END, PATCH))[PATCH]
        self.max_pixels = max_pixels

    def tokens_for(self, image: ImageInput) -> int:
        """One image token per merged 2x2 cell of the image's patch grid."""
        if image.grid_thw is None:
            raise ValueError("a Muse Glimmer image needs its patch grid")
        t, h, w = image.grid_thw
        return t * h * w // self.config.merge_unit

    def prepare(self, data: bytes) -> PreparedImage:
        """Decode and preprocess one image (ImageError naming what is wrong)."""
        patches, grid = preprocess_muse_glimmer(decode_image(data, self.max_pixels), self.config)
        return PreparedImage((ImageInput(patches, grid_thw=grid),))

    def expansion(self, image: PreparedImage) -> str:
        return f"{START}{PATCH * self.tokens_for(image.views[0])}{END}"
