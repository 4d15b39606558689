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
    # Extensions for instruction-tuned embedders (Qwen3-Embedding): "query" puts the model's task
    # instruction before each input (`instruction` replaces its default task); documents go as they are.
    input_type: Literal["query", "document"] | None = None
    instruction: str | None = Field(default=None, min_length=1, max_length=2000)


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
