"""What every text embedder offers: the contract the server and the Studio program against.

An embedder turns texts into unit-length float32 vectors. It never trims input silently:
a text longer than the model's window is truncated and `EmbeddingResult.truncated` says
so, and `count_tokens` reports the untruncated length so a caller can reject instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class EmbeddingResult:
    """Vectors of a batch of texts, in input order, and what the model read of each."""

    vectors: np.ndarray  # float32 [n, dimensions], each row L2-normalised
    token_counts: list[int]  # tokens the model read per text (special tokens included, after truncation)
    truncated: list[bool]  # True where the text was longer than `max_tokens` and its tail was dropped

    @property
    def total_tokens(self) -> int:
        return sum(self.token_counts)


@runtime_checkable
class Embedder(Protocol):
    model_name: str
    dimensions: int
    max_tokens: int  # the model's window per text, special tokens included

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Untruncated token count of each text, special tokens included."""
        ...

    def embed(self, texts: list[str]) -> np.ndarray:
        """float32 `[len(texts), dimensions]`, L2-normalised rows, in input order."""
        ...

    def encode(self, texts: list[str]) -> EmbeddingResult:
        """`embed` plus per-text token counts and truncation flags."""
        ...


def check_texts(texts: Sequence[str], name: str = "texts") -> list[str]:
    """The texts as a list, or a TypeError naming the first thing that is not a string.

    A bare string is refused: iterating it would embed its characters one by one.
    """
    if isinstance(texts, str | bytes) or not isinstance(texts, Sequence):
        raise TypeError(f"{name} must be a list of strings, got {type(texts).__name__}")
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"{name}[{index}] must be a string, got {type(text).__name__}")
    return list(texts)
