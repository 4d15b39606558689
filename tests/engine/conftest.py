"""Shared fixtures for engine tests: the embedded Gemma 3 270M checkpoint, opened once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.engine.loader.weights import Checkpoint, open_checkpoint


@pytest.fixture(scope="session")
def embedded_gguf_path() -> Path:
    """Path of the embedded Gemma 3 270M Q4_K_M GGUF (assembled from its package on first use)."""
    from app.engine.loader.embedded import embedded_gguf_path

    return embedded_gguf_path()


@pytest.fixture(scope="session")
def embedded_checkpoint(embedded_gguf_path: Path) -> Checkpoint:
    """The embedded GGUF opened as a Checkpoint (memory-mapped; tests must not write to its tensors)."""
    return open_checkpoint(embedded_gguf_path)


# A tiny SentencePiece vocabulary with byte fallback, for grammar masks checked by hand.
GRAMMAR_PIECES = ('{"', '"}', '":', "▁", "▁true", "▁false", "true", "ok", "o", "k", '"', "}", "<", "s>")


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """`<unk>`, `<s>`, `</s>` (EOS), the 256 byte pieces, then GRAMMAR_PIECES, from GGUF-style metadata."""
    from app.engine.loader.tokenizer import BYTE, CONTROL, NORMAL, UNKNOWN, Tokenizer

    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *GRAMMAR_PIECES]
    types = [UNKNOWN, CONTROL, CONTROL, *[BYTE] * 256, *[NORMAL] * len(GRAMMAR_PIECES)]
    return Tokenizer.from_gguf_metadata({
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.scores": [0.0] * 259 + [-float(i) for i in range(len(GRAMMAR_PIECES))],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_space_prefix": False,
    })  # fmt: skip
