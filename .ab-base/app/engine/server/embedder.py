"""What the embeddings endpoint needs from an embedding model (app/engine/embeddings/ provides one)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import numpy as np


class Embedder(Protocol):
    model_name: str
    dimensions: int
    max_tokens: int  # per input; longer inputs are rejected, never trimmed

    def count_tokens(self, texts: list[str]) -> list[int]: ...

    def embed(self, texts: list[str]) -> np.ndarray:
        """float32 [len(texts), dimensions], each row L2-normalised."""
        ...


# A decoder embedder (app/engine/tasks/pooling.py: DecoderEmbedder) offers more, found by attribute:
# `min_dimensions` (with `embed(texts, dimensions)`: output sizes min_dimensions..dimensions) and
# `query_texts(texts, instruction)` (queries after their task instruction).
