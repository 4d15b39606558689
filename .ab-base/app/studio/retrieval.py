"""Retrieval for document Q&A: located chunks, embeddings, top-k cosine search, a cited prompt.

Chunks never cross a section, so every chunk keeps the location its answer cites ("page 3",
"sheet Budget"). Embedding goes through the `Embedder` protocol; the engine supplies the real
MiniLM one and tests a deterministic stand-in.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from app.studio.documents import Document

ProgressCallback = Callable[[int, int], None]  # (chunks embedded so far, chunks in all)
CancelCheck = Callable[[], bool]  # true once the user asked to stop

DEFAULT_CHUNK_TOKENS = 200
DEFAULT_OVERLAP_TOKENS = 32
# Line breaks and sentence ends are where a chunk may be cut without splitting a thought.
_PIECE_BOUNDARY = re.compile(r"\n+|(?<=[.!?])\s+")


@runtime_checkable
class Embedder(Protocol):
    model_name: str
    dimensions: int
    max_tokens: int  # longer inputs are truncated by the model

    def count_tokens(self, texts: Sequence[str]) -> list[int]: ...

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 [len(texts), dimensions], each row L2-normalised."""
        ...


class IngestCancelled(Exception):
    """Ingestion stopped because its cancel check said so; the index was left unchanged."""


@dataclass(frozen=True)
class Chunk:
    text: str
    source: str  # the document's path
    location: str  # "page 3", "sheet Budget", "section Intro"
    tokens: int

    @property
    def citation(self) -> str:
        return f"{Path(self.source).name}, {self.location}"


@dataclass(frozen=True)
class Hit:
    chunk: Chunk
    score: float  # cosine similarity to the question, in [-1, 1]


@dataclass(frozen=True)
class Citation:
    """One numbered excerpt given to the model with the question (here, below doc_qa and doc_pages,
    which both number them)."""

    number: int
    hit: Hit
    image: bool = False  # a PDF page the model was shown as an image (its text, if any, is for the reader)

    @property
    def label(self) -> str:
        return f"[{self.number}] {self.hit.chunk.citation}"

    @property
    def text(self) -> str:
        return self.hit.chunk.text


def chunk_document(
    document: Document,
    count_tokens: Callable[[Sequence[str]], list[int]],
    max_tokens: int = DEFAULT_CHUNK_TOKENS,
    overlap_tokens: int = DEFAULT_OVERLAP_TOKENS,
) -> list[Chunk]:
    """Cut each section into chunks of at most ~max_tokens, overlapping by up to overlap_tokens.

    Pieces (lines, sentences) are packed whole; a piece longer than a chunk is split by words.
    Token counts are the embedder's own, counted per piece, so a chunk's total is a close estimate.
    """
    if max_tokens < 8:
        raise ValueError(f"max_tokens must be at least 8, got {max_tokens}")
    if not 0 <= overlap_tokens < max_tokens // 2:
        raise ValueError(f"overlap_tokens must be between 0 and {max_tokens // 2 - 1}, got {overlap_tokens}")
    chunks = []
    for section in document.sections:
        pieces = [piece.strip() for piece in _PIECE_BOUNDARY.split(section.text) if piece.strip()]
        sized = _split_long_pieces(pieces, count_tokens(pieces) if pieces else [], max_tokens, count_tokens)
        for text, tokens in _pack(sized, max_tokens, overlap_tokens):
            chunks.append(
                Chunk(text=text, source=str(document.path), location=section.location, tokens=tokens)
            )
    return chunks


def _split_long_pieces(
    pieces: list[str], counts: list[int], max_tokens: int, count_tokens: Callable[[Sequence[str]], list[int]]
) -> list[tuple[str, int]]:
    sized = []
    for piece, tokens in zip(pieces, counts, strict=True):
        words = piece.split()
        if tokens <= max_tokens or len(words) < 2:
            sized.append((piece, tokens))  # a single over-long word is left for the model to truncate
            continue
        # Words per part from the piece's own token density, with room for the estimate to be off;
        # a part that still comes out too long is split again.
        per_part = max(1, min(len(words) - 1, int(len(words) * max_tokens * 0.9 / tokens)))
        parts = [" ".join(words[start : start + per_part]) for start in range(0, len(words), per_part)]
        sized.extend(_split_long_pieces(parts, count_tokens(parts), max_tokens, count_tokens))
    return sized


def _pack(sized: list[tuple[str, int]], max_tokens: int, overlap_tokens: int) -> Iterable[tuple[str, int]]:
    current: list[tuple[str, int]] = []
    for piece, tokens in sized:
        if current and sum(count for _, count in current) + tokens > max_tokens:
            yield _join(current)
            current = _tail(current, overlap_tokens, room=max_tokens - tokens)
        current.append((piece, tokens))
    if current:
        yield _join(current)


def _tail(pieces: list[tuple[str, int]], overlap_tokens: int, room: int) -> list[tuple[str, int]]:
    """The last whole pieces of a chunk, up to overlap_tokens, that still leave room for the next piece."""
    tail: list[tuple[str, int]] = []
    budget = min(overlap_tokens, room)
    for piece, tokens in reversed(pieces):
        if tokens > budget:
            break
        tail.insert(0, (piece, tokens))
        budget -= tokens
    return tail


def _join(pieces: list[tuple[str, int]]) -> tuple[str, int]:
    return "\n".join(piece for piece, _ in pieces), sum(tokens for _, tokens in pieces)


class DocumentIndex:
    """Chunks and their unit vectors; search is one matrix-vector product (cosine = dot)."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self.chunks: list[Chunk] = []
        self.vectors = np.zeros((0, embedder.dimensions), dtype=np.float32)

    def __len__(self) -> int:
        return len(self.chunks)

    def add(self, chunks: Sequence[Chunk], vectors: np.ndarray) -> None:
        vectors = _check_vectors(vectors, len(chunks), self.embedder)
        self.chunks.extend(chunks)
        self.vectors = np.concatenate([self.vectors, vectors])

    def search(self, question: str, k: int = 5) -> list[Hit]:
        if not question.strip():
            raise ValueError("the question is empty")
        return self.search_vector(embed_query(self.embedder, question), k)

    def search_vector(self, query: np.ndarray, k: int = 5) -> list[Hit]:
        """The k most similar chunks, best first (ties keep insertion order)."""
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        scores = self.vectors @ np.asarray(query, dtype=np.float32)
        order = np.argsort(-scores, kind="stable")[:k]
        return [Hit(chunk=self.chunks[i], score=float(scores[i])) for i in order]

    def remove_source(self, source: str | Path) -> int:
        """Forget every chunk of one document; returns how many were dropped."""
        keep = [i for i, chunk in enumerate(self.chunks) if chunk.source != str(source)]
        dropped = len(self.chunks) - len(keep)
        self.chunks = [self.chunks[i] for i in keep]
        self.vectors = self.vectors[keep]
        return dropped


def ingest_documents(
    documents: Sequence[Document],
    embedder: Embedder,
    index: DocumentIndex | None = None,
    max_tokens: int = DEFAULT_CHUNK_TOKENS,
    overlap_tokens: int = DEFAULT_OVERLAP_TOKENS,
    batch_size: int = 32,
    progress: ProgressCallback | None = None,
    cancel: CancelCheck | None = None,
) -> DocumentIndex:
    """Chunk and embed documents into `index` (a new one if None).

    Progress is reported after each batch as (embedded, total). If `cancel()` turns true between
    batches, IngestCancelled is raised and the index is unchanged: chunks are added all at once.
    """
    index = index if index is not None else DocumentIndex(embedder)
    budget = min(max_tokens, embedder.max_tokens - 2)  # the model's own [CLS]/[SEP]-style tokens
    chunks = [
        chunk
        for document in documents
        for chunk in chunk_document(
            document, embedder.count_tokens, budget, min(overlap_tokens, budget // 2 - 1)
        )
    ]
    vectors = []
    if progress:
        progress(0, len(chunks))
    for start in range(0, len(chunks), batch_size):
        if cancel is not None and cancel():
            raise IngestCancelled(f"ingestion cancelled after {start} of {len(chunks)} chunks")
        batch = chunks[start : start + batch_size]
        vectors.append(_check_vectors(embedder.embed([chunk.text for chunk in batch]), len(batch), embedder))
        if progress:
            progress(start + len(batch), len(chunks))
    if chunks:
        index.add(chunks, np.concatenate(vectors))
    return index


def build_question_prompt(question: str, hits: Sequence[Hit], first: int = 1) -> str:
    """A user message with the retrieved excerpts numbered [first].., each under its citation."""
    if not question.strip():
        raise ValueError("the question is empty")
    excerpts = "\n\n".join(
        f"[{n}] {hit.chunk.citation}\n{hit.chunk.text}" for n, hit in enumerate(hits, start=first)
    )
    return (
        "Answer the question using only the excerpts below. After each statement, cite the excerpts "
        "it relies on by number in square brackets, e.g. [1]. If the excerpts do not contain the answer, "
        "say that you cannot find it in the documents.\n\n"
        f"Excerpts:\n\n{excerpts}\n\n"
        f"Question: {question.strip()}"
    )


def embed_query(embedder: Embedder, question: str) -> np.ndarray:
    """The question's vector: after the embedder's task instruction where it takes one (Qwen3-Embedding
    embeds queries so and documents as they are), else as a document."""
    embed_queries = getattr(embedder, "embed_queries", None)
    vectors = embed_queries([question]) if embed_queries is not None else embedder.embed([question])
    return _check_vectors(vectors, 1, embedder)[0]


def _check_vectors(vectors: np.ndarray, count: int, embedder: Embedder) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.shape != (count, embedder.dimensions):
        raise ValueError(
            f"embedder {embedder.model_name!r} returned shape {vectors.shape}, "
            f"expected ({count}, {embedder.dimensions})"
        )
    if not np.isfinite(vectors).all():
        raise ValueError(f"embedder {embedder.model_name!r} returned non-finite values")
    # The protocol promises unit rows; renormalising is cheap and keeps scores true cosines.
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)
