"""Reranking (`POST /v1/rerank`, `/rerank`, `/v2/rerank`) in Cohere's and Jina's shape, pydantic only.

Requests from Cohere (v1 and v2), Jina and vLLM clients all fit `RerankRequest`; fields
they send that are not listed (`max_tokens_per_doc`, `rank_fields`, ...) are ignored.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from app.engine.server.limits import EdgeChecked


class RerankDocument(BaseModel):
    text: str


class RerankRequest(EdgeChecked):
    model: str | None = Field(default=None, description="the embedding model's name; omit for the default")
    query: str
    documents: list[str | RerankDocument]
    top_n: int | None = Field(default=None, description="return the n best (default: every document)")
    return_documents: bool = Field(default=True, description="echo each document's text in its result")


class RerankResult(BaseModel):
    index: int = Field(description="position in the request's documents")
    relevance_score: float
    document: RerankDocument | None = None


class RerankUsage(BaseModel):
    total_tokens: int


class RerankMeta(BaseModel):
    """Extension: which scorer ran, and what it could not read in full."""

    method: str = Field(description="'embedding-cosine' (cosine in [-1, 1]) or 'decoder-yes-no' (P(yes))")
    scorer_model: str
    truncated_documents: list[int] = Field(description="documents scored on their beginning only")
    query_truncated: bool


class RerankResponse(BaseModel):
    id: str
    model: str
    results: list[RerankResult] = Field(description="best first")
    usage: RerankUsage
    meta: RerankMeta
