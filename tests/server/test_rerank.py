"""/v1/rerank (and Cohere's /v2/rerank, vLLM's /rerank) over a live server with the shipped MiniLM embedder.

No chat model is involved, so these run against the scripted fake engine only.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from app.engine.embeddings import BertEmbedder, load_default_embedder

from .conftest import running_server
from .fakes import FakeEmbedder, FakeEngine
from .helpers import CLIENT_TIMEOUT

QUERY = "How often should I water my garden?"
DOCUMENTS = [
    "The stock market fell sharply on Tuesday after the interest rate decision.",
    "Water a vegetable garden early in the morning so the soil stays moist through the day.",
    "The cat slept all afternoon on the warm windowsill.",
]
RELEVANT = 1


@pytest.fixture(scope="module")
def minilm() -> BertEmbedder:
    return load_default_embedder()


@pytest.fixture(scope="module")
def http(minilm: BertEmbedder) -> Iterator[httpx.Client]:
    with (
        running_server(FakeEngine(), minilm) as server,
        httpx.Client(base_url=server.base_url, timeout=CLIENT_TIMEOUT) as client,
    ):
        yield client


def test_the_relevant_passage_ranks_first_and_the_scorer_is_named(
    http: httpx.Client, minilm: BertEmbedder
) -> None:
    response = http.post(
        "/v1/rerank", json={"model": minilm.model_name, "query": QUERY, "documents": DOCUMENTS}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    results = body["results"]
    assert results[0]["index"] == RELEVANT
    assert sorted(r["index"] for r in results) == [0, 1, 2]
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True) and all(-1.0 <= s <= 1.0 for s in scores)
    assert [r["document"]["text"] for r in results] == [DOCUMENTS[r["index"]] for r in results]
    assert body["meta"] == {
        "method": "embedding-cosine",
        "scorer_model": minilm.model_name,
        "truncated_documents": [],
        "query_truncated": False,
    }
    assert body["model"] == minilm.model_name and body["id"].startswith("rerank-")
    assert body["usage"]["total_tokens"] == sum(minilm.count_tokens([QUERY, *DOCUMENTS]))


@pytest.mark.parametrize("path", ["/rerank", "/v2/rerank"])
def test_cohere_and_vllm_paths_take_object_documents_and_top_n(http: httpx.Client, path: str) -> None:
    documents = [{"text": text} for text in DOCUMENTS]
    response = http.post(
        path, json={"query": QUERY, "documents": documents, "top_n": 1, "return_documents": False}
    )
    assert response.status_code == 200, response.text
    (only,) = response.json()["results"]
    assert only["index"] == RELEVANT and "document" not in only


def test_top_n_above_the_document_count_returns_them_all(http: httpx.Client) -> None:
    response = http.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS, "top_n": 10})
    assert len(response.json()["results"]) == len(DOCUMENTS)


def test_a_document_past_the_window_is_reported_as_truncated(
    http: httpx.Client, minilm: BertEmbedder
) -> None:
    long_document = "garden " * (minilm.max_tokens + 50)
    response = http.post("/v1/rerank", json={"query": QUERY, "documents": [DOCUMENTS[0], long_document]})
    meta = response.json()["meta"]
    assert meta["truncated_documents"] == [1] and meta["query_truncated"] is False


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"query": QUERY, "documents": []}, "documents", "empty"),
        ({"query": QUERY, "documents": DOCUMENTS, "top_n": 0}, "top_n", "at least 1"),
        ({"query": QUERY, "documents": DOCUMENTS, "top_n": -3}, "top_n", "-3"),
        ({"query": "   ", "documents": DOCUMENTS}, "query", "empty"),
        ({"query": QUERY}, "documents", "required"),
        ({"query": QUERY, "documents": [{"title": "no text"}]}, "documents[0]", ""),
    ],
)
def test_bad_requests_get_400_in_openai_shape(http: httpx.Client, body: dict, param: str, words: str) -> None:
    response = http.post("/v1/rerank", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"].startswith(param) and words in error["message"]


def test_an_unknown_model_is_404_naming_the_embedder(http: httpx.Client, minilm: BertEmbedder) -> None:
    response = http.post(
        "/v1/rerank", json={"model": "rerank-english-v3.0", "query": QUERY, "documents": DOCUMENTS}
    )
    assert response.status_code == 404
    assert minilm.model_name in response.json()["error"]["message"]


def test_an_embedder_without_encode_still_reranks_and_a_server_without_one_says_so() -> None:
    fake = FakeEmbedder()  # the server's narrower protocol: count_tokens and embed only
    with running_server(FakeEngine(), fake) as server:
        response = httpx.post(f"{server.base_url}/v1/rerank", json={"query": "q", "documents": ["a", "bb"]})
        assert response.status_code == 200
        assert response.json()["meta"]["scorer_model"] == fake.model_name
        assert response.json()["usage"]["total_tokens"] == 1 + 1 + 2
    with running_server(FakeEngine(), None) as server:
        response = httpx.post(f"{server.base_url}/v1/rerank", json={"query": "q", "documents": ["a"]})
        assert response.status_code == 404 and "No reranking" in response.json()["error"]["message"]
