"""Image soft tokens for a step: which flat rows are image tokens, their embeddings, and each
sequence's image spans for the two-way attention inside an image.

Each image content (`ImageInput.key`) is encoded once and kept in a small LRU: a request whose
prefix cache hit ends inside an image, or the next turn that re-sends it after its KV was
evicted, reuses the soft tokens instead of running the tower again. A chunk whose tokens are all
served from the prefix cache never gets here.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from app.engine.backend.base import Backend
from app.engine.images import ImageInput

DEFAULT_CACHED_IMAGES = 32


class SoftTokenTowers:
    """A model's image and audio towers behind the one `encode_image` the embedder calls: each input
    goes to its modality's tower (Gemma 4 with vision and audio)."""

    def __init__(self, image: Any = None, audio: Any = None) -> None:
        self.towers = {"image": image, "audio": audio}
        # the text model's two-way image spans are the image tower's; audio tokens stay causal
        self.two_way_images = bool(getattr(image, "two_way_images", False))

    def encode_image(self, item: ImageInput) -> Any:
        tower = self.towers.get(item.modality)
        if tower is None:
            raise ValueError(f"the model has no {item.modality} tower")
        return tower.encode_image(item)


class ImageEmbedder:
    def __init__(self, vision: Any, backend: Backend, max_cached: int = DEFAULT_CACHED_IMAGES) -> None:
        self.vision = vision
        self.backend = backend
        self.max_cached = max_cached
        self._features: OrderedDict[str, Any] = OrderedDict()
        self.encoded = 0  # images run through the tower (a test and the stats read it)
        # Gemma 3's image tokens attend both ways inside their image; Qwen2.5-VL's stay causal
        self.two_way = bool(getattr(vision, "two_way_images", True))

    def features(self, image: ImageInput) -> Any:
        """`[tokens, hidden]` soft tokens of one image view, encoded at most once while cached."""
        found = self._features.get(image.key)
        if found is not None:
            self._features.move_to_end(image.key)
            return found
        found = self.vision.encode_image(image)
        self.encoded += 1
        self._features[image.key] = found
        while len(self._features) > self.max_cached:
            self._features.popitem(last=False)
        return found

    @staticmethod
    def touches_images(chunk: Any) -> bool:
        end = chunk.start + chunk.num_tokens
        return any(img.start < end and chunk.start < img.end for img in chunk.request.images)

    def step_inputs(self, chunks: list[Any]) -> tuple[tuple[Any, Any], list[list[tuple[int, int]]]] | None:
        """`((rows, values), spans)` for the step's image tokens, or None for a text-only step."""
        if not any(self.touches_images(c) for c in chunks):
            return None
        rows, values, spans = [], [], []
        offset = 0
        for chunk in chunks:
            start, end = chunk.start, chunk.start + chunk.num_tokens
            own = []
            for img in chunk.request.images:
                lo, hi = max(start, img.start), min(end, img.end)
                if lo >= hi:
                    continue
                rows.append(np.arange(lo, hi) - start + offset)
                values.append(self.features(img.image)[lo - img.start : hi - img.start])
                if self.two_way and img.image.modality == "image":  # audio tokens attend causally
                    own.append((img.start, img.end))
            spans.append(own)
            offset += chunk.num_tokens
        b = self.backend
        return (b.from_host(np.concatenate(rows)), b.xp.concatenate(values)), spans
