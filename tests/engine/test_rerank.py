"""Reranking: the embedding-cosine scorer on the shipped MiniLM, and the decoder scorer's seam."""

from __future__ import annotations

import math

import numpy as np
import pytest

from app.engine.embeddings import DEFAULT_EMBEDDING_MODEL, load_default_embedder
from app.engine.tasks.rerank import (
    DECODER_YES_NO,
    EMBEDDING_COSINE,
    EmbeddingCosineReranker,
    RankedDocument,
    Reranker,
    YesNoReranker,
    qwen3_reranker_prompt,
    rank,
    rerank,
    yes_probability,
)

QUERY = "What is the capital of France?"
DOCUMENTS = [
    "The Great Barrier Reef is the world's largest coral reef system, off the coast of Australia.",
    "Bananas are rich in potassium and are one of the most widely eaten fruits.",
    "Paris is the capital and most populous city of France.",
    "The stock market closed higher on Friday after strong earnings reports.",
    "Mount Kilimanjaro is the highest mountain in Africa.",
    # Near misses: a capital of elsewhere, France without its capital, another French city.
    "Berlin is the capital and largest city of Germany.",
    "France is famous for its wine, cheese and long history.",
    "Lyon is a large city in France known for its food.",
]


def test_known_relevant_passage_ranks_first() -> None:
    ranking = rerank(QUERY, DOCUMENTS)
    assert ranking.method == EMBEDDING_COSINE
    assert ranking.model == DEFAULT_EMBEDDING_MODEL
    assert ranking.results[0].index == 2
    assert sorted(r.index for r in ranking.results) == list(range(len(DOCUMENTS)))
    scores = [r.relevance_score for r in ranking.results]
    assert scores == sorted(scores, reverse=True)
    assert scores[0] - scores[1] > 0.1  # a clear margin over the near misses, not a near-tie
    assert ranking.truncated_documents == [] and not ranking.query_truncated


def test_scores_are_the_embedders_cosines() -> None:
    embedder = load_default_embedder()
    vectors = embedder.embed([QUERY, *DOCUMENTS])
    ranking = rerank(QUERY, DOCUMENTS, reranker=EmbeddingCosineReranker(embedder))
    by_index = {r.index: r.relevance_score for r in ranking.results}
    for i in range(len(DOCUMENTS)):
        expected = float(vectors[i + 1] @ vectors[0]) / float(
            np.linalg.norm(vectors[i + 1]) * np.linalg.norm(vectors[0])
        )
        assert by_index[i] == pytest.approx(expected, abs=1e-5)
    assert ranking.total_tokens == sum(embedder.count_tokens([QUERY, *DOCUMENTS]))


def test_top_n_cuts_and_a_large_top_n_returns_all() -> None:
    assert [r.index for r in rerank(QUERY, DOCUMENTS, top_n=1).results] == [2]
    assert len(rerank(QUERY, DOCUMENTS, top_n=99).results) == len(DOCUMENTS)
    assert rerank(QUERY, [], top_n=3).results == []


def test_long_documents_are_reported_as_truncated() -> None:
    ranking = rerank(QUERY, ["Paris is in France. " * 100, "short"])
    assert ranking.truncated_documents == [0]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"query": "  "}, ValueError, "query is empty"),
        ({"query": 5}, TypeError, "query must be a string"),
        ({"documents": "one document"}, TypeError, "documents must be a list of strings"),
        ({"documents": ["ok", None]}, TypeError, r"documents\[1\] must be a string"),
        ({"top_n": 0}, ValueError, "top_n must be a positive integer, got 0"),
        ({"top_n": True}, ValueError, "top_n must be a positive integer"),
    ],
)
def test_bad_requests_are_named(kwargs: dict, error: type[Exception], message: str) -> None:
    arguments = {"query": QUERY, "documents": DOCUMENTS, "top_n": None, **kwargs}
    with pytest.raises(error, match=message):
        rerank(**arguments)


def test_rank_orders_by_score_and_keeps_ties_in_input_order() -> None:
    assert rank([0.1, 0.5, 0.5, -0.2], top_n=3) == [
        RankedDocument(1, 0.5),
        RankedDocument(2, 0.5),
        RankedDocument(0, 0.1),
    ]


# -- the decoder scorer's seam, driven by a stand-in for the decoder -----------------------

YES, NO, VOCAB = 7, 3, 10


def _fake_decoder(prompts: list[str]) -> tuple[np.ndarray, list[int]]:
    """Final-position logits that favour "yes" when the document mentions Paris."""
    logits = np.zeros((len(prompts), VOCAB), dtype=np.float32)
    for row, prompt in enumerate(prompts):
        document = prompt.split("<Document>: ", 1)[1]
        logits[row, YES] = 4.0 if "Paris" in document else -2.0
        logits[row, NO] = 1.0
    return logits, [len(p.split()) for p in prompts]


def test_yes_no_reranker_ranks_by_probability_of_yes() -> None:
    scorer = YesNoReranker("fake-qwen3-reranker", _fake_decoder, yes_token_id=YES, no_token_id=NO)
    assert isinstance(scorer, Reranker)
    ranking = rerank(QUERY, DOCUMENTS, top_n=2, reranker=scorer)
    assert ranking.method == DECODER_YES_NO and ranking.model == "fake-qwen3-reranker"
    assert ranking.results[0].index == 2
    expected_top = math.exp(4.0) / (math.exp(4.0) + math.exp(1.0))
    assert ranking.results[0].relevance_score == pytest.approx(expected_top)
    assert ranking.results[1].relevance_score == pytest.approx(
        math.exp(-2.0) / (math.exp(-2.0) + math.exp(1.0))
    )


def test_yes_no_reranker_rejects_a_wrong_logits_shape() -> None:
    scorer = YesNoReranker("bad", lambda prompts: (np.zeros(VOCAB), [1]), yes_token_id=YES, no_token_id=NO)
    with pytest.raises(ValueError, match="final_logits returned shape"):
        rerank(QUERY, DOCUMENTS, reranker=scorer)


def test_yes_probability_is_stable_at_extreme_logits() -> None:
    got = yes_probability(np.array([0.0, 1000.0, -1000.0, 2.0]), np.array([0.0, -1000.0, 1000.0, 1.0]))
    np.testing.assert_allclose(got, [0.5, 1.0, 0.0, 1 / (1 + math.exp(-1.0))], atol=1e-12)


def test_qwen3_prompt_carries_query_document_and_answer_slot() -> None:
    prompt = qwen3_reranker_prompt("my query", "my document", "my instruction")
    assert "<Instruct>: my instruction\n<Query>: my query\n<Document>: my document" in prompt
    assert prompt.startswith("<|im_start|>system\n")
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
