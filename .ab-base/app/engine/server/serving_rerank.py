"""Reranking: a query and documents -> `app.engine.tasks.rerank` -> results best first, saying which scorer ran.

With no reranker model loaded, the server's embedder scores by cosine similarity
("embedding-cosine"); a decoder reranker ("decoder-yes-no") can be passed in instead.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import anyio
import numpy as np

from app.engine.embeddings.base import EmbeddingResult
from app.engine.server.embedder import Embedder
from app.engine.server.errors import ApiError, bad_request, model_not_found
from app.engine.server.limits import embedding_char_cap
from app.engine.server.prompting import ensure_encodable
from app.engine.server.protocol.rerank import (
    RerankDocument,
    RerankMeta,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
)
from app.engine.server.serving_base import ServingContext, new_id
from app.engine.tasks.rerank import EmbeddingCosineReranker, Ranking, Reranker, rerank

MAX_DOCUMENTS = 1000  # Cohere's limit per request; each document is one embedder row


class ServingRerank:
    def __init__(self, ctx: ServingContext, reranker: Reranker | None = None) -> None:
        self.ctx = ctx
        if reranker is None and ctx.embedder is not None:
            reranker = EmbeddingCosineReranker(_with_encode(ctx.embedder))  # type: ignore[arg-type]
        self.reranker = reranker
        self._lock = asyncio.Lock()  # one scoring pass at a time: the CPU has no room for two

    async def create(self, req: RerankRequest) -> RerankResponse | ApiError:
        try:
            reranker = self._check_model(req.model)
            documents = _documents(req)
        except ApiError as error:
            return error
        query, read = _bounded(reranker, [req.query, *documents])
        async with self._lock:
            ranking = await anyio.to_thread.run_sync(rerank, query, read, req.top_n, reranker)
        return _response(req, _with_cuts(ranking, query, read, req.query, documents), documents)

    def _check_model(self, name: str | None) -> Reranker:
        if self.reranker is None:
            message = "No reranking or embedding model is loaded on this server."
            raise ApiError(404, message, param="model", code="model_not_found")
        names = list(dict.fromkeys([self.reranker.model_name, *self.ctx.models.embedding_names]))
        if name is not None and name not in names:
            raise model_not_found(name, names)
        return self.reranker


def _documents(req: RerankRequest) -> list[str]:
    """Plain texts, after the checks `rerank()` would otherwise answer with a bare ValueError."""
    ensure_encodable(req.query, "query")
    if not req.query.strip():
        raise bad_request("'query' is empty.", param="query")
    if not req.documents:
        raise bad_request("'documents' is empty: give at least one document to rank.", param="documents")
    if len(req.documents) > MAX_DOCUMENTS:
        raise bad_request(
            f"'documents' has {len(req.documents)} items; at most {MAX_DOCUMENTS} are allowed.",
            param="documents",
        )
    if req.top_n is not None and req.top_n < 1:
        raise bad_request(
            f"'top_n' must be at least 1 (it was {req.top_n}); leave it out to get every document.",
            param="top_n",
        )
    texts = [doc if isinstance(doc, str) else doc.text for doc in req.documents]
    for index, text in enumerate(texts):
        ensure_encodable(text, f"documents[{index}]")
    return texts


def _bounded(reranker: Reranker, texts: list[str]) -> tuple[str, list[str]]:
    """(query, documents) as the scorer gets them: an embedding scorer reads a text's first window of
    tokens only, so each text is cut to `embedding_char_cap` characters before it is tokenized. (A decoder
    scorer refuses an over-long prompt itself; the body cap bounds what it tokenizes.)"""
    if not isinstance(reranker, EmbeddingCosineReranker):
        return texts[0], texts[1:]
    cap = embedding_char_cap(reranker.embedder.max_tokens)
    cut = [text[:cap] for text in texts]
    return cut[0], cut[1:]


def _with_cuts(ranking: Ranking, query: str, read: list[str], sent_query: str, sent: list[str]) -> Ranking:
    """The ranking, with the texts cut before tokenizing counted as truncated (the scorer saw only their
    beginning, as it would have)."""
    cut = {i for i, (kept, whole) in enumerate(zip(read, sent, strict=True)) if len(kept) < len(whole)}
    return replace(
        ranking,
        truncated_documents=sorted(cut.union(ranking.truncated_documents)),
        query_truncated=ranking.query_truncated or len(query) < len(sent_query),
    )


def _response(req: RerankRequest, ranking: Ranking, documents: list[str]) -> RerankResponse:
    results = [
        RerankResult(
            index=ranked.index,
            relevance_score=ranked.relevance_score,
            document=RerankDocument(text=documents[ranked.index]) if req.return_documents else None,
        )
        for ranked in ranking.results
    ]
    return RerankResponse(
        id=new_id("rerank-"),
        model=req.model or ranking.model,
        results=results,
        usage=RerankUsage(total_tokens=ranking.total_tokens),
        meta=RerankMeta(
            method=ranking.method,
            scorer_model=ranking.model,
            truncated_documents=ranking.truncated_documents,
            query_truncated=ranking.query_truncated,
        ),
    )


class _CountingEmbedder:
    """The engine's `Embedder.encode` from the server's narrower protocol (count_tokens + embed).

    Embedders that implement `encode` themselves (the BERT one does) are used as they are.
    """

    def __init__(self, embedder: Embedder) -> None:
        self._embedder = embedder
        self.model_name = embedder.model_name
        self.dimensions = embedder.dimensions
        self.max_tokens = embedder.max_tokens
        self.query_texts = getattr(embedder, "query_texts", None)  # what an instruction-tuned one has

    def count_tokens(self, texts: list[str]) -> list[int]:
        return self._embedder.count_tokens(texts)

    def embed(self, texts: list[str]) -> np.ndarray:
        return self._embedder.embed(texts)

    def encode(self, texts: list[str]) -> EmbeddingResult:
        counts = self._embedder.count_tokens(texts)
        return EmbeddingResult(
            self._embedder.embed(texts),
            [min(count, self.max_tokens) for count in counts],
            [count > self.max_tokens for count in counts],
        )


def _with_encode(embedder: Embedder) -> object:
    return embedder if callable(getattr(embedder, "encode", None)) else _CountingEmbedder(embedder)
