"""Qwen2.5-VL's 3D position ids (t, h, w) of a request's tokens, as transformers' `get_rope_index`.

Text tokens count up one by one with all three ids equal. An image's run of tokens, its merged
grid `(t, h, w)` in row-major order, starts at the position `p` the next text token would take:
token (i, j, k) gets ids `(p + i, p + j, p + k)`. The text after it resumes at
`p + max(h, w)` (the image spans that many positions, not its token count), so every later
token sits `delta` below its sequence index, decode steps included.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def mrope_positions(images: Sequence[Any], start: int, count: int, merge: int) -> np.ndarray:
    """`[3, count]` int32 position ids of sequence indices `start .. start + count - 1` of a
    request whose images (`PromptImage`s with `image.grid_thw`, in prompt order) are `images`;
    `merge` is the vision tower's spatial merge (its grid is in patches, the tokens are merged)."""
    index = np.arange(start, start + count, dtype=np.int64)
    out = np.repeat(index[None], 3, axis=0)
    shift = 0  # how far below its sequence index the current text token's position is
    for img in images:
        if img.start >= start + count:
            break
        _, h, w = img.image.grid_thw  # the temporal index comes from the token offset
        h, w = h // merge, w // merge
        inside = (index >= img.start) & (index < img.end)
        k = index[inside] - img.start  # offsets into the image's t*h*w tokens, row-major
        out[:, inside] = img.start - shift + np.stack([k // (h * w), k // w % h, k % w])
        shift += (img.end - img.start) - max(h, w)
        after = index >= img.end
        out[:, after] = index[after] - shift
    return out.astype(np.int32)
