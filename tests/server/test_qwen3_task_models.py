"""Qwen3-Embedding and Qwen3-Reranker served beside the chat model (the scripted fake and the
embedded Gemma 3): /v1/embeddings with the query instruction and `dimensions`, /v1/rerank with the
yes/no score, both equal to the model cards' transformers computation
(tests/fixtures/make_qwen3_task_reference.py), and the chat model still answering."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from app.engine.server.launch import ServerHandle
from app.engine.server.settings import ServerSettings
from app.engine.tasks.task_model import load_decoder_embedder, load_decoder_reranker
from tests.engine.qwen3_task_fixtures import DOCUMENTS, EMBEDDING, MANIFEST, QUERIES, RERANKER, references
from tests.server.fakes import FakeEngine


@pytest.fixture(scope="module")
def refs() -> dict[str, np.ndarray]:
    return references()


@pytest.fixture(scope="module")
def server(engine: Any) -> Iterator[ServerHandle]:
    embedder = load_decoder_embedder(EMBEDDING, device="cpu")
    reranker = load_decoder_reranker(RERANKER, device="cpu")
    handle = ServerHandle(engine, settings=ServerSettings(port=0), embedder=embedder, reranker=reranker)
    handle.start()
    yield handle
    handle.stop()


@pytest.fixture
def client(server: ServerHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture
def http(server: ServerHandle) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=60) as session:
        yield session


def _vectors(response: Any) -> np.ndarray:
    return np.array([item.embedding for item in response.data], dtype=np.float32)


def test_embeddings_of_queries_and_documents_match_the_model_card(client, refs):
    queries = client.embeddings.create(model="embedding", input=QUERIES, extra_body={"input_type": "query"})
    documents = client.embeddings.create(model="embedding", input=DOCUMENTS, encoding_format="float")
    vectors = np.concatenate([_vectors(queries), _vectors(documents)])
    np.testing.assert_allclose(vectors, refs["embeddings"], rtol=0, atol=1e-4)
    assert (vectors * refs["embeddings"]).sum(axis=1).min() > 0.9999
    counted = [len(ids) for ids in MANIFEST["embedding_token_ids"]]
    assert queries.usage.prompt_tokens == sum(counted[: len(QUERIES)])  # the instruction counted in


def test_dimensions_are_cut_and_renormalised(client, refs):
    cut = MANIFEST["mrl_dimensions"]
    response = client.embeddings.create(model="embedding", input=DOCUMENTS, dimensions=cut)
    np.testing.assert_allclose(_vectors(response), refs["embeddings_mrl"][len(QUERIES) :], rtol=0, atol=1e-4)
    for wrong in (8, 65):
        with pytest.raises(openai.BadRequestError) as caught:
            client.embeddings.create(model="embedding", input="x", dimensions=wrong)
        assert caught.value.body["param"] == "dimensions" and "32 to 64" in caught.value.body["message"]


def test_an_instruction_applies_to_queries_only(client):
    custom = client.embeddings.create(
        model="embedding", input="gravity", extra_body={"input_type": "query", "instruction": "Find physics"}
    )
    plain = client.embeddings.create(model="embedding", input="Instruct: Find physics\nQuery:gravity")
    np.testing.assert_allclose(_vectors(custom), _vectors(plain), rtol=0, atol=1e-6)
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model="embedding", input="x", extra_body={"instruction": "Find physics"})
    assert caught.value.body["param"] == "instruction"


def test_rerank_scores_match_the_model_card(http, refs):
    for q, query in enumerate(QUERIES):
        response = http.post("/v1/rerank", json={"model": "reranker", "query": query, "documents": DOCUMENTS})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["meta"]["method"] == "decoder-yes-no" and body["meta"]["scorer_model"] == "reranker"
        expected = refs["rerank_scores"][q * len(DOCUMENTS) : (q + 1) * len(DOCUMENTS)]
        scores = {r["index"]: r["relevance_score"] for r in body["results"]}
        np.testing.assert_allclose([scores[i] for i in range(len(DOCUMENTS))], expected, rtol=0, atol=1e-4)
        assert [r["index"] for r in body["results"]] == list(np.argsort(-expected))


def test_the_task_models_are_listed_and_the_chat_model_still_answers(client, engine):
    names = [card.id for card in client.models.list().data]
    assert {engine.model.name, "embedding", "reranker"} <= set(names)
    reply = client.chat.completions.create(
        model=engine.model.name, messages=[{"role": "user", "content": "Hi"}], max_tokens=3, temperature=0
    )
    assert reply.choices[0].message.content is not None and reply.usage.completion_tokens >= 1


def test_without_a_reranker_the_qwen3_embedders_cosines_rank_with_the_query_instructed(refs):
    embedder = load_decoder_embedder(EMBEDDING, device="cpu")
    with ServerHandle(FakeEngine(), settings=ServerSettings(port=0), embedder=embedder) as handle:
        body = httpx.post(
            f"{handle.base_url}/v1/rerank", json={"query": QUERIES[1], "documents": DOCUMENTS}, timeout=60
        ).json()
    assert body["meta"]["method"] == "embedding-cosine" and body["meta"]["scorer_model"] == "embedding"
    vectors = refs["embeddings"]  # the card's query (instructed) and document rows
    expected = [float(vectors[len(QUERIES) + d] @ vectors[1]) for d in range(len(DOCUMENTS))]
    scores = {r["index"]: r["relevance_score"] for r in body["results"]}
    np.testing.assert_allclose([scores[d] for d in range(len(DOCUMENTS))], expected, rtol=0, atol=1e-4)
