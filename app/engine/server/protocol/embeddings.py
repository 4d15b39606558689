"""OpenAI embeddings (`POST /v1/embeddings`), pydantic only."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from app.engine.server.limits import EdgeChecked


class EmbeddingRequest(EdgeChecked):
    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # base64 of little-endian float32 when encoding_format is "base64"


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage
