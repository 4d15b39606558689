"""Texts to padded id batches for an encoder, with truncation that is reported, not silent.

Wraps a Hugging Face `tokenizers` tokenizer. The tokenizer file's own truncation and
padding settings are switched off (all-MiniLM-L6-v2's file pads everything to 128, for
example): the window comes from the model folder, and batches are padded only to their
longest member. A text over the window is cut the way sentence-transformers cuts it
(the library's truncation, special tokens kept), and its full length is remembered.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer


@dataclass(frozen=True)
class TokenizedText:
    ids: list[int]  # what the model reads, special tokens included, at most the window
    full_length: int  # tokens before truncation, special tokens included

    @property
    def truncated(self) -> bool:
        return self.full_length > len(self.ids)


@dataclass(frozen=True)
class PaddedBatch:
    input_ids: np.ndarray  # int64 [batch, longest]
    attention_mask: np.ndarray  # int64 [batch, longest], 1 for real tokens


class WindowTokenizer:
    """A tokenizer bound to a model's window of `max_tokens` (special tokens included).

    It takes `tokenizer` over: its truncation and padding settings are switched off.
    Encoding is thread-safe (the Rust tokenizer is only read).
    """

    def __init__(self, tokenizer: Tokenizer, max_tokens: int, pad_id: int = 0) -> None:
        if max_tokens < 2:
            raise ValueError(f"max_tokens must be at least 2 (room for the special tokens), got {max_tokens}")
        self.max_tokens = max_tokens
        self.pad_id = pad_id
        self._full = tokenizer
        self._full.no_truncation()
        self._full.no_padding()
        # A second instance does the cutting, so the common path never re-tokenizes.
        self._cutting = Tokenizer.from_str(tokenizer.to_str())
        self._cutting.no_padding()
        self._cutting.enable_truncation(max_length=max_tokens)

    @classmethod
    def from_file(cls, path: Path, max_tokens: int) -> WindowTokenizer:
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as error:  # the Rust side raises a bare Exception
            raise ValueError(f"cannot load tokenizer {path}: {error}") from error
        pad_id = tokenizer.token_to_id("[PAD]")
        return cls(tokenizer, max_tokens, 0 if pad_id is None else pad_id)

    def count(self, texts: list[str]) -> list[int]:
        return [len(e.ids) for group in _groups(texts) for e in self._full.encode_batch(group)]

    def tokenize(self, texts: list[str]) -> list[TokenizedText]:
        return [row for group in _groups(texts) for row in self._tokenize(group)]

    def _tokenize(self, texts: list[str]) -> list[TokenizedText]:
        full = [e.ids for e in self._full.encode_batch(texts)]
        long_rows = [i for i, ids in enumerate(full) if len(ids) > self.max_tokens]
        cut = self._cutting.encode_batch([texts[i] for i in long_rows]) if long_rows else []
        kept = list(full)
        for row, encoding in zip(long_rows, cut, strict=True):
            kept[row] = encoding.ids
        return [TokenizedText(ids, len(f)) for ids, f in zip(kept, full, strict=True)]

    def pad(self, rows: list[TokenizedText]) -> PaddedBatch:
        longest = max(len(r.ids) for r in rows)
        input_ids = np.full((len(rows), longest), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), longest), dtype=np.int64)
        for i, row in enumerate(rows):
            input_ids[i, : len(row.ids)] = row.ids
            mask[i, : len(row.ids)] = 1
        return PaddedBatch(input_ids, mask)


# Characters encoded in one `encode_batch` call. The library's Encodings (ids, offsets, token strings,
# masks) take ~100 bytes a token, all alive until the call returns: 16 MB of text at once held ~2 GB.
GROUP_CHARS = 1 << 20


def _groups(texts: list[str], max_chars: int | None = None) -> list[list[str]]:
    """Consecutive runs of texts of at most `max_chars` (default GROUP_CHARS) together (a longer text
    alone), in order."""
    limit = GROUP_CHARS if max_chars is None else max_chars
    groups: list[list[str]] = []
    size = 0
    for text in texts:
        if not groups or size + len(text) > limit:
            groups.append([])
            size = 0
        groups[-1].append(text)
        size += len(text)
    return groups


def plan_batches(lengths: list[int], max_batch_tokens: int, max_batch_size: int) -> list[list[int]]:
    """Group text indices into batches, longest first, so padding stays small.

    A batch's padded size (members x longest member) stays within `max_batch_tokens`
    unless a single text alone exceeds it, and a text much shorter than its batch's
    longest starts a new batch instead of being padded (attention cost grows with the
    square of the padded length).
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        if current:
            longest = lengths[current[0]]
            full = (len(current) + 1) * longest > max_batch_tokens or len(current) >= max_batch_size
            if full or _mostly_padding(longest, lengths[index]):
                batches.append(current)
                current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches


def _mostly_padding(longest: int, length: int) -> bool:
    # More than a quarter padding, and enough tokens of it to outweigh one more forward pass.
    return length < 0.75 * longest and longest - length >= 8
