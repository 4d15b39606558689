"""Issue 40: what a request makes the server tokenize is bounded before any tokenizing. A 15 MB rerank
query was tokenized whole to keep its first 256 tokens (41 s, +5.2 GB); a 15 MB embeddings input was
tokenized whole to be refused (16 s, +1.7 GB). Memory figures are bench/lab/request_memory.py's."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from app.engine.server.limits import embedding_char_cap

from .conftest import running_server
from .fakes import FakeEmbedder, FakeEngine


class RecordingEmbedder(FakeEmbedder):
    """The fake embedder, remembering the longest text it was ever given to tokenize or embed."""

    def __init__(self) -> None:
        self.longest = 0

    def count_tokens(self, texts: list[str]) -> list[int]:
        self.longest = max([self.longest, *map(len, texts)])
        return super().count_tokens(texts)

    def embed(self, texts: list[str]) -> np.ndarray:
        self.longest = max([self.longest, *map(len, texts)])
        return super().embed(texts)


@pytest.fixture
def recorder() -> RecordingEmbedder:
    return RecordingEmbedder()


@pytest.fixture
def http(recorder: RecordingEmbedder) -> Iterator[httpx.Client]:
    with (
        running_server(FakeEngine(), recorder) as server,
        httpx.Client(base_url=server.base_url, timeout=120) as client,
    ):
        yield client


def test_an_embeddings_input_past_the_character_cap_is_refused_before_tokenizing(http, recorder):
    cap = embedding_char_cap(recorder.max_tokens)
    big = "word " * (cap // 5 + 1)
    response = http.post("/v1/embeddings", json={"model": recorder.model_name, "input": ["ok", big]})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "input"
    assert f"input[1] has {len(big)} characters" in error["message"] and str(cap) in error["message"]
    assert recorder.longest == 0  # nothing reached the tokenizer
    # at the cap the text is tokenized, and refused by its token count as before
    at_cap = http.post("/v1/embeddings", json={"model": recorder.model_name, "input": "x" * cap})
    assert at_cap.status_code == 400 and f"has {cap} tokens" in at_cap.json()["error"]["message"]
    assert recorder.longest == cap


def test_a_huge_rerank_query_and_document_are_cut_before_tokenizing_and_reported(http, recorder):
    cap = embedding_char_cap(recorder.max_tokens)
    huge = "garden " * 300_000  # 2.1 MB; the scorer reads its first window only
    body = {"query": huge, "documents": ["short", huge, "x" * cap]}
    response = http.post("/v1/rerank", json=body)
    assert response.status_code == 200, response.text
    meta = response.json()["meta"]
    assert meta["query_truncated"] is True
    assert meta["truncated_documents"] == [1, 2]  # 1 was cut here, 2 by the scorer's own window
    assert recorder.longest == cap
    short = http.post("/v1/rerank", json={"query": "garden", "documents": ["short"]}).json()["meta"]
    assert short["query_truncated"] is False and short["truncated_documents"] == []
