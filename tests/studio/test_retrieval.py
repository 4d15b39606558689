"""Chunking, search and prompts, with a deterministic bag-of-words embedder as the model."""

from __future__ import annotations

import itertools
import re
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from app.studio.documents import Document, Section
from app.studio.retrieval import (
    Embedder,
    IngestCancelled,
    build_question_prompt,
    chunk_document,
    ingest_documents,
)

WORD = re.compile(r"[a-z0-9]+")


class BagOfWordsEmbedder:
    """Each word hashed to one of `dimensions` buckets; a token is a word. Deterministic and exact."""

    model_name = "test-bag-of-words"

    def __init__(self, dimensions: int = 512, max_tokens: int = 64) -> None:
        self.dimensions = dimensions
        self.max_tokens = max_tokens
        self.embedded: list[str] = []

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return [len(WORD.findall(text.lower())) for text in texts]

    def counts(self, text: str) -> np.ndarray:
        vector = np.zeros(self.dimensions, dtype=np.float64)
        for word in WORD.findall(text.lower()):
            vector[zlib.crc32(word.encode()) % self.dimensions] += 1
        return vector

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.embedded.extend(texts)
        rows = np.stack([self.counts(text) for text in texts])
        return (rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)).astype(np.float32)


def make_document() -> Document:
    fruit = " ".join(f"Sentence {n} is about orchards and harvest." for n in range(1, 13))
    return Document(
        path=Path("/docs/report.pdf"),
        kind="pdf",
        sections=[
            Section(location="page 1", text="The meeting starts at nine.\nCoffee is served in the lobby."),
            Section(location="page 2", text=fruit),
            Section(location="page 3", text="Pears cost four dollars and twenty five cents per kilogram."),
        ],
        page_count=3,
    )


def test_test_embedder_satisfies_the_protocol() -> None:
    assert isinstance(BagOfWordsEmbedder(), Embedder)


def test_chunks_keep_locations_and_stay_under_budget() -> None:
    embedder = BagOfWordsEmbedder()
    document = make_document()
    chunks = chunk_document(document, embedder.count_tokens, max_tokens=20, overlap_tokens=7)
    assert next(chunk.location for chunk in chunks) == "page 1"
    assert {chunk.location for chunk in chunks} == {"page 1", "page 2", "page 3"}
    for chunk in chunks:
        assert chunk.tokens == embedder.count_tokens([chunk.text])[0] <= 20
        assert chunk.citation == f"report.pdf, {chunk.location}"
        section = next(s for s in document.sections if s.location == chunk.location)
        for line in chunk.text.splitlines():
            assert line in section.text  # nothing crosses a section
    page_two = [chunk.text for chunk in chunks if chunk.location == "page 2"]
    assert len(page_two) > 1
    for n in range(1, 13):  # every sentence lands in some chunk
        assert any(f"Sentence {n} is about" in text for text in page_two)
    # Consecutive chunks share their boundary sentence (7 words fit the 7-token overlap).
    for before, after in itertools.pairwise(page_two):
        assert before.splitlines()[-1] == after.splitlines()[0]


def test_overlong_piece_is_split_by_words() -> None:
    embedder = BagOfWordsEmbedder()
    words = [f"w{n}" for n in range(100)]
    document = Document(path=Path("a.txt"), kind="text", sections=[Section("lines 1-1", " ".join(words))])
    chunks = chunk_document(document, embedder.count_tokens, max_tokens=16, overlap_tokens=0)
    assert all(chunk.tokens <= 16 for chunk in chunks)
    assert " ".join(chunk.text.replace("\n", " ") for chunk in chunks).split() == words


def test_chunking_rejects_bad_sizes() -> None:
    embedder = BagOfWordsEmbedder()
    with pytest.raises(ValueError, match="max_tokens must be at least 8"):
        chunk_document(make_document(), embedder.count_tokens, max_tokens=4)
    with pytest.raises(ValueError, match="overlap_tokens must be between 0 and 9"):
        chunk_document(make_document(), embedder.count_tokens, max_tokens=20, overlap_tokens=10)


def test_search_ranks_the_relevant_chunk_first_with_true_cosines() -> None:
    embedder = BagOfWordsEmbedder()
    index = ingest_documents([make_document()], embedder, max_tokens=20, overlap_tokens=0)
    question = "How much do pears cost per kilogram?"
    hits = index.search(question, k=3)
    assert hits[0].chunk.location == "page 3"
    assert [hit.score for hit in hits] == sorted((hit.score for hit in hits), reverse=True)
    # Independent reference: cosine of raw word-count vectors.
    query = embedder.counts(question)
    for hit in hits:
        chunk_counts = embedder.counts(hit.chunk.text)
        expected = query @ chunk_counts / (np.linalg.norm(query) * np.linalg.norm(chunk_counts))
        assert hit.score == pytest.approx(expected, abs=1e-5)
    assert len(index.search(question, k=100)) == len(index)
    with pytest.raises(ValueError, match="question is empty"):
        index.search("   ")
    with pytest.raises(ValueError, match="k must be at least 1"):
        index.search(question, k=0)


def test_ingest_reports_progress_and_respects_the_model_limit() -> None:
    embedder = BagOfWordsEmbedder(max_tokens=12)
    seen: list[tuple[int, int]] = []
    index = ingest_documents(
        [make_document()], embedder, max_tokens=200, batch_size=2, progress=lambda d, t: seen.append((d, t))
    )
    total = len(index)
    assert seen[0] == (0, total) and seen[-1] == (total, total)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    assert all(chunk.tokens <= 10 for chunk in index.chunks)  # 12 minus two special tokens


def test_cancelled_ingest_leaves_the_index_unchanged() -> None:
    embedder = BagOfWordsEmbedder()
    index = ingest_documents([make_document()], embedder, max_tokens=20)
    before = len(index)
    calls = iter([False, True])
    with pytest.raises(IngestCancelled, match="cancelled after 1 of"):
        ingest_documents([make_document()], embedder, index=index, batch_size=1, cancel=lambda: next(calls))
    assert len(index) == before
    assert index.vectors.shape == (before, embedder.dimensions)


def test_index_remove_source() -> None:
    embedder = BagOfWordsEmbedder()
    other = Document(
        path=Path("/docs/other.txt"), kind="text", sections=[Section("lines 1-1", "Pears again.")]
    )
    index = ingest_documents([make_document(), other], embedder, max_tokens=20)
    before = len(index)
    assert index.remove_source("/docs/report.pdf") == before - 1
    assert [hit.chunk.source for hit in index.search("pears", k=5)] == ["/docs/other.txt"]


def test_wrong_embedder_output_is_named() -> None:
    class Broken(BagOfWordsEmbedder):
        model_name = "broken-model"

        def embed(self, texts: Sequence[str]) -> np.ndarray:
            return np.zeros((len(texts), 3), dtype=np.float32)

    with pytest.raises(ValueError, match=r"embedder 'broken-model' returned shape \(\d+, 3\), expected"):
        ingest_documents([make_document()], Broken())


def test_question_prompt_numbers_excerpts_with_citations() -> None:
    index = ingest_documents([make_document()], BagOfWordsEmbedder(), max_tokens=20)
    hits = index.search("What do pears cost?", k=2)
    prompt = build_question_prompt("What do pears cost?", hits)
    assert f"[1] report.pdf, page 3\n{hits[0].chunk.text}" in prompt
    assert f"[2] {hits[1].chunk.citation}\n" in prompt
    assert prompt.rstrip().endswith("Question: What do pears cost?")
    assert "square brackets" in prompt
    with pytest.raises(ValueError, match="question is empty"):
        build_question_prompt(" ", hits)
