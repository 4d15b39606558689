"""OpenAI embeddings: texts -> the embedding model -> float lists or base64 float32."""

from __future__ import annotations

import asyncio
import base64
import functools

import anyio
import numpy as np

from app.engine.server.embedder import Embedder
from app.engine.server.errors import ApiError, bad_request
from app.engine.server.limits import embedding_char_cap
from app.engine.server.prompting import ensure_encodable
from app.engine.server.protocol.embeddings import (
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingUsage,
)
from app.engine.server.serving_base import ServingContext

MAX_INPUTS = 2048  # OpenAI's own limit per request


class OpenAIServingEmbeddings:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx
        self._lock = asyncio.Lock()  # one batch at a time: the embedder is not assumed thread-safe

    async def create(self, req: EmbeddingRequest) -> EmbeddingResponse | ApiError:
        try:
            texts = self.texts(req)
        except ApiError as error:
            return error
        embedder = self.ctx.embedder
        assert embedder is not None  # texts() checked
        async with self._lock:
            counts = await anyio.to_thread.run_sync(embedder.count_tokens, texts)
            too_long = next(((i, n) for i, n in enumerate(counts) if n > embedder.max_tokens), None)
            if too_long is not None:
                index, count = too_long
                return bad_request(
                    f"input[{index}] has {count} tokens; the embedding model {embedder.model_name} takes at most "
                    f"{embedder.max_tokens}. Shorten or split it.",
                    param="input",
                    code="context_length_exceeded",
                )
            if req.dimensions is not None and req.dimensions != embedder.dimensions:
                embed = functools.partial(embedder.embed, dimensions=req.dimensions)  # type: ignore[call-arg]
            else:
                embed = embedder.embed
            vectors = await anyio.to_thread.run_sync(embed, texts)
        data = [
            EmbeddingData(index=i, embedding=_encode(vector, req.encoding_format))
            for i, vector in enumerate(vectors)
        ]
        total = int(sum(counts))
        return EmbeddingResponse(
            data=data, model=req.model, usage=EmbeddingUsage(prompt_tokens=total, total_tokens=total)
        )

    def texts(self, req: EmbeddingRequest) -> list[str]:
        if error := self.ctx.models.check_embedding(req.model):
            raise error
        embedder = self.ctx.embedder
        assert embedder is not None
        raw = req.input
        texts = [raw] if isinstance(raw, str) else raw
        if not texts:
            raise bad_request("'input' is empty.", param="input")
        if not all(isinstance(text, str) for text in texts):
            raise bad_request("Token-id input is not supported for embeddings; send text.", param="input")
        if len(texts) > MAX_INPUTS:
            raise bad_request(
                f"'input' has {len(texts)} items; at most {MAX_INPUTS} are allowed.", param="input"
            )
        cap = embedding_char_cap(embedder.max_tokens)
        for i, text in enumerate(texts):
            ensure_encodable(text, f"input[{i}]")  # type: ignore[arg-type]
            if not text:
                raise bad_request(f"input[{i}] is an empty string.", param="input")
            if len(text) > cap:  # type: ignore[arg-type]
                raise bad_request(
                    f"input[{i}] has {len(text)} characters; the embedding model {embedder.model_name} reads at "  # type: ignore[arg-type]
                    f"most {embedder.max_tokens} tokens, and texts over {cap} characters are refused before "
                    "tokenizing. Shorten or split it.",
                    param="input",
                    code="context_length_exceeded",
                )
        self._check_dimensions(req, embedder)
        return self._with_instruction(req, embedder, texts)  # type: ignore[arg-type]

    @staticmethod
    def _check_dimensions(req: EmbeddingRequest, embedder: Embedder) -> None:
        if req.dimensions is None or req.dimensions == embedder.dimensions:
            return
        low = getattr(embedder, "min_dimensions", None)
        if low is None:
            raise bad_request(
                f"{embedder.model_name} produces {embedder.dimensions} dimensions; 'dimensions' cannot change that.",
                param="dimensions",
            )
        if not low <= req.dimensions <= embedder.dimensions:
            raise bad_request(
                f"'dimensions' is {req.dimensions}; {embedder.model_name} gives {low} to "
                f"{embedder.dimensions}.",
                param="dimensions",
            )

    @staticmethod
    def _with_instruction(req: EmbeddingRequest, embedder: Embedder, texts: list[str]) -> list[str]:
        """Queries after the model's task instruction; documents (and an unspecified input_type) as sent."""
        query_texts = getattr(embedder, "query_texts", None)
        if query_texts is None:  # queries and documents alike (input_type is a hint it has no use for)
            if req.instruction is not None:
                raise bad_request(
                    f"{embedder.model_name} takes no task instruction; leave out 'instruction'.",
                    param="instruction",
                )
            return texts
        if req.instruction is not None and req.input_type != "query":
            raise bad_request(
                "'instruction' applies to queries: send it with input_type 'query'.", param="instruction"
            )
        if req.input_type == "query":
            ensure_encodable(req.instruction or "", "instruction")
            return query_texts(texts, req.instruction)
        return texts


def _encode(vector: np.ndarray, encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return [float(x) for x in np.asarray(vector, dtype=np.float32)]
