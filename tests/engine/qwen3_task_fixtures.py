"""The Qwen3-Embedding / Qwen3-Reranker fixtures (tests/fixtures/make_qwen3_task_reference.py) as the
engine and server tests read them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

TASKS = Path(__file__).parents[1] / "fixtures" / "qwen3_tasks"
EMBEDDING, EMBEDDING_GGUF = TASKS / "embedding", TASKS / "embedding-f16.gguf"
RERANKER, RERANKER_GGUF = TASKS / "reranker", TASKS / "reranker-f16.gguf"  # the GGUF in llama.cpp's layout
MANIFEST = json.loads((TASKS / "manifest.json").read_text())
QUERIES, DOCUMENTS = MANIFEST["queries"], MANIFEST["documents"]


def references() -> dict[str, np.ndarray]:
    """The model cards' results: embeddings, embeddings_mrl, rerank_scores, rerank_margins."""
    with np.load(TASKS / "references.npz") as data:
        return dict(data)
