"""What Qwen2.5-VL's, PaddleOCR-VL's and Muse Glimmer's vision configs mean alike: a tower of `num_heads`
heads with 2D rotary positions over `patch_size` patches that the projector merges `merge_size` a side.
One base for the sizes those four fields decide and the head check the 2D rotary embedding needs, so
the three frozen configs derive them the same way."""

from __future__ import annotations

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


def check_pixels_bounds(min_pixels: int, max_pixels: int, processor: str) -> None:
    """A dynamic-resolution processor's bounds (Qwen2VLImageProcessor's and PaddleOCR-VL's) are ordered
    and positive; CheckpointError naming the processor's file otherwise."""
    if not 0 < min_pixels <= max_pixels:
        raise CheckpointError(f"{processor}: min_pixels {min_pixels} / max_pixels {max_pixels}")
