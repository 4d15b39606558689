"""Images into pixel values, as Hugging Face's Gemma3ImageProcessor (PIL backend) makes them.

Steps, in its order: decode (EXIF orientation applied, as transformers' `load_image` does),
RGB with transparency composited onto white, optional pan-and-scan crops of the uint8 image,
then for the image and each crop: PIL bilinear resize to the tower's square, rescale in
float64 then float32, normalize with float32 mean/std. The tests hold the values to the HF
processor's on odd sizes and aspect ratios.
"""

from __future__ import annotations

import io
import itertools
import math
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps

from app.engine.models.vision.config import PanAndScan, VisionConfig

MAX_IMAGE_PIXELS = 50_000_000  # Pillow warns above ~89M; a larger image is refused before decoding


class ImageError(ValueError):
    """An image that cannot be used: undecodable, too large, or of an unknown format."""


def decode_image(data: bytes, max_pixels: int = MAX_IMAGE_PIXELS) -> Image.Image:
    """Decode image bytes (PNG, JPEG, WebP, GIF first frame, ...) to an RGB PIL image."""
    try:
        image = Image.open(io.BytesIO(data))
        width, height = image.size
        if width * height > max_pixels:
            raise ImageError(f"image is {width}x{height} pixels; at most {max_pixels} pixels are accepted")
        image.load()
        image = ImageOps.exif_transpose(image)
    except ImageError:
        raise
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise ImageError(f"image could not be decoded: {exc}") from None
    return to_rgb(image)


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB, transparency composited onto a white background (transformers' `convert_to_rgb`)."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


@dataclass(frozen=True)
class ProcessedImage:
    pixel_values: np.ndarray  # float32 [1 + num_crops, 3, S, S]: the whole image, then its crops
    num_crops: int


def pan_and_scan_crops(image: np.ndarray, pas: PanAndScan) -> list[np.ndarray]:
    """Crops of a `[C, H, W]` uint8 image along its long side, or none when it is not elongated."""
    _, height, width = image.shape
    long, short = (width, height) if width >= height else (height, width)
    if long / short < pas.min_ratio_to_activate:
        return []
    n = math.floor(long / short + 0.5)  # half rounds up
    n = min(math.floor(long / pas.min_crop_size), n)
    n = min(pas.max_num_crops, max(2, n))
    crops_w, crops_h = (n, 1) if width >= height else (1, n)
    crop_w, crop_h = math.ceil(width / crops_w), math.ceil(height / crops_h)
    if min(crop_w, crop_h) < pas.min_crop_size:
        return []
    return [
        image[:, y : y + crop_h, x : x + crop_w]
        for y, x in itertools.product(
            [crop_h * i for i in range(crops_h)], [crop_w * i for i in range(crops_w)]
        )
    ]


def resize_normalize(
    image: np.ndarray, height: int, width: int, resample: int, rescale: float, mean, std
) -> np.ndarray:
    """A `[3, H, W]` uint8 image PIL-resized to `height x width`, rescaled in float64 then float32,
    normalized with float32 mean/std: transformers' PIL backend step by step."""
    pil = Image.fromarray(np.ascontiguousarray(image.transpose(1, 2, 0)))
    resized = np.asarray(pil.resize((width, height), resample=resample)).transpose(2, 0, 1)
    scaled = (resized.astype(np.float64) * rescale).astype(np.float32)
    return (scaled - np.asarray(mean, np.float32)[:, None, None]) / np.asarray(std, np.float32)[:, None, None]


def _resize_normalize(image: np.ndarray, cfg: VisionConfig) -> np.ndarray:
    side = cfg.image_size
    return resize_normalize(
        image, side, side, cfg.resample, cfg.rescale_factor, cfg.image_mean, cfg.image_std
    )


def preprocess(image: Image.Image, cfg: VisionConfig) -> ProcessedImage:
    """Pixel values for the tower: the whole image, then its pan-and-scan crops when enabled."""
    array = np.asarray(to_rgb(image)).transpose(2, 0, 1)  # [3, H, W] uint8
    crops = pan_and_scan_crops(array, cfg.pan_and_scan) if cfg.pan_and_scan else []
    pixels = np.stack([_resize_normalize(img, cfg) for img in [array, *crops]])
    return ProcessedImage(pixels, len(crops))
