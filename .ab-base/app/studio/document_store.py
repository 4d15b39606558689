"""A document set kept on disk: its documents, their excerpts and the excerpts' embeddings.

Two files in one folder: `documents.json` (each document's description and every chunk's
text, source, location and token count) and `vectors.npy` (the unit vectors, one row per
chunk, in the same order). Embedding is the slow part of adding a document, so it is
stored, not redone; the embedder's vector width is stored too, and a set embedded by
another model (a different width) is not loaded. Files are written to temporary names
and renamed, vectors first, so a crash never pairs new text with old vectors.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from app.studio.retrieval import Chunk

log = logging.getLogger(__name__)
FORMAT = 1


def save_documents(folder: Path, documents: list[dict[str, Any]], chunks: list[Chunk], vectors: np.ndarray) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"format": FORMAT, "dimensions": int(vectors.shape[1]) if vectors.ndim == 2 else 0,
            "documents": documents, "chunks": [asdict(chunk) for chunk in chunks]}
    with open(folder / "vectors.npy.tmp", "wb") as handle:  # np.save would add its own .npy suffix
        np.save(handle, np.asarray(vectors, dtype=np.float32))
    (folder / "documents.json.tmp").write_text(json.dumps(meta, ensure_ascii=False), encoding="utf-8")
    os.replace(folder / "vectors.npy.tmp", folder / "vectors.npy")
    os.replace(folder / "documents.json.tmp", folder / "documents.json")


def load_documents(folder: Path) -> tuple[list[dict[str, Any]], list[Chunk], np.ndarray] | None:
    """(documents, chunks, vectors) as saved, or None when there is nothing usable (logged)."""
    try:
        meta = json.loads((folder / "documents.json").read_text(encoding="utf-8"))
        vectors = np.load(folder / "vectors.npy", allow_pickle=False)
        chunks = [Chunk(**chunk) for chunk in meta["chunks"]]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as exc:
        log.warning("ignoring the saved document set in %s: %s", folder, exc)
        return None
    if meta.get("format") != FORMAT or vectors.ndim != 2 or len(vectors) != len(chunks):
        log.warning("ignoring the saved document set in %s: it does not match its vectors", folder)
        return None
    return list(meta["documents"]), chunks, vectors.astype(np.float32, copy=False)
