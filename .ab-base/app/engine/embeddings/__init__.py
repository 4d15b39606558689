"""Text embeddings: the `Embedder` contract and the BERT-family encoder behind `/v1/embeddings`."""

from __future__ import annotations

from app.engine.embeddings.base import Embedder, EmbeddingResult
from app.engine.embeddings.bert_embedder import (
    DEFAULT_EMBEDDING_MODEL,
    BertEmbedder,
    default_model_dir,
    load_default_embedder,
)

__all__ = [
    "DEFAULT_EMBEDDING_MODEL",
    "BertEmbedder",
    "Embedder",
    "EmbeddingResult",
    "default_model_dir",
    "load_default_embedder",
]
