"""What Qwen2.5-VL's, PaddleOCR-VL's and Muse Glimmer's vision configs mean alike: a tower of `num_heads`
heads with 2D rotary positions over `patch_size` patches that the projector merges `merge_size` a side.
One base for the sizes those four fields decide and the head check the 2D rotary embedding needs, so
the three frozen configs derive them the same way; and the dynamic-resolution processor's settings that
Qwen2.5-VL's and PaddleOCR-VL's share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.engine.loader.names import CheckpointError


class MergedPatchTower:
    """Mixed into a frozen dataclass that has these fields (a plain base: it adds no fields of its own)."""

    hidden_size: int
    num_heads: int
    patch_size: int
    merge_size: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def merge_unit(self) -> int:
        """Patches in one merged patch (one soft token)."""
        return self.merge_size * self.merge_size

    @property
    def factor(self) -> int:
        """What both sides of a resized image are multiples of: one merged patch."""
        return self.patch_size * self.merge_size

    def check_rotary_heads(self, where: str) -> None:
        """The 2D rotary embedding splits each half of a head between rows and columns: the head size
        must be whole and divisible by 4; CheckpointError naming `where` otherwise."""
        if self.hidden_size % self.num_heads or self.head_dim % 4:
            raise CheckpointError(
                f"{where}: hidden_size {self.hidden_size} over {self.num_heads} heads is no head size "
                "divisible by 4 (the 2D rotary embedding splits each half between rows and columns)"
            )


@dataclass(frozen=True, kw_only=True)
class DynamicResolution:
    """A dynamic-resolution image processor's settings (Qwen2VLImageProcessor's, PaddleOCR-VL's): each image
    resized to whole merged patches within `min_pixels`..`max_pixels`, rescaled, normalized per channel.
    Keyword-only fields, so a config's own fields come first in its constructor."""

    min_pixels: int
    max_pixels: int
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    rescale_factor: float = 1 / 255
    resample: int = 3  # PIL bicubic

    def check_pixels_bounds(self, processor: str) -> None:
        """The bounds are ordered and positive; CheckpointError naming the processor's file otherwise."""
        if not 0 < self.min_pixels <= self.max_pixels:
            raise CheckpointError(f"{processor}: min_pixels {self.min_pixels} / max_pixels {self.max_pixels}")


def pixels_bounds(proc: dict[str, Any], defaults: dict[str, Any]) -> tuple[int, int]:
    """transformers 5 writes the bounds as size.shortest_edge / longest_edge, older files as
    min/max_pixels (which win where both are given, as in the HF processor's constructor);
    `defaults`' min/max_pixels where the file has neither (PaddleOCR-VL's processor reads them alike)."""
    size = proc.get("size") or {}
    low = proc.get("min_pixels") or size.get("shortest_edge") or defaults["min_pixels"]
    high = proc.get("max_pixels") or size.get("longest_edge") or defaults["max_pixels"]
    return int(low), int(high)


def dynamic_resolution(processor: dict[str, Any] | None, defaults: dict[str, Any]) -> dict[str, Any]:
    """`DynamicResolution`'s fields from an image processor's settings as its file gives them (`defaults` for
    what it leaves out; the bounds by `pixels_bounds`, never a default min/max_pixels over the file's size)."""
    proc = {**defaults, **(processor or {})}
    low, high = pixels_bounds(processor or {}, defaults)
    return {
        "min_pixels": low,
        "max_pixels": high,
        "image_mean": tuple(float(v) for v in proc["image_mean"]),
        "image_std": tuple(float(v) for v in proc["image_std"]),
        "rescale_factor": float(proc["rescale_factor"]),
        "resample": int(proc["resample"]),
    }
