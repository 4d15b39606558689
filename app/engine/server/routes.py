"""Thin HTTP routes: parse (pydantic), call the serving layer, map its result to JSON, SSE or an error."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Form, Request, Response
from pydantic import BaseModel

from app.engine.server.errors import ApiError, Dialect, model_not_found
from app.engine.server.generation import disconnect_waiter
from app.engine.server.protocol.anthropic import (
    AnthropicErrorResponse,
    CountTokensRequest,
    CountTokensResponse,
    MessageResponse,
    MessagesRequest,
)
from app.engine.server.protocol.audio import TranscriptionForm, TranscriptionJson, TranscriptionVerbose
from app.engine.server.protocol.chat import ChatCompletionRequest, ChatCompletionResponse
from app.engine.server.protocol.completions import CompletionRequest, CompletionResponse
from app.engine.server.protocol.embeddings import EmbeddingRequest, EmbeddingResponse
from app.engine.server.protocol.openai import ErrorResponse, ModelCard, ModelList
from app.engine.server.protocol.rerank import RerankRequest, RerankResponse
from app.engine.server.protocol.responses import ResponseObject, ResponsesRequest
from app.engine.server.protocol.tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from app.engine.server.services import Services
from app.engine.server.serving_audio import TRANSCRIPTIONS_PATH
from app.engine.server.sse import sse_response

router = APIRouter()

# One server-sent event (sent when the request says "stream": true): JSON data, or "[DONE]" ending OpenAI streams.
_SSE_EVENT = {
    "type": "object",
    "description": "A server-sent event",
    "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
    "required": ["data"],
}
_STREAM = {"text/event-stream": {"schema": _SSE_EVENT}}


def _errors(model: type[BaseModel], *codes: int) -> dict[int | str, dict[str, Any]]:
    descriptions = {
        400: "Invalid request",
        401: "Missing or wrong API key",
        404: "Unknown model",
        413: "Body too large",
        429: "Too many requests in flight",
        503: "Engine unavailable",
    }
    return {code: {"model": model, "description": descriptions[code]} for code in codes}


_OPENAI_ERRORS = _errors(ErrorResponse, 400, 401, 404, 413, 429, 503)
_ANTHROPIC_ERRORS = _errors(AnthropicErrorResponse, 400, 401, 404, 413, 429, 503)
_OPENAI_STREAMING = {200: {"content": _STREAM}, **_OPENAI_ERRORS}
# json and verbose_json come back as JSON; text, srt and vtt as plain text
_TRANSCRIPTION = {
    200: {
        "model": TranscriptionJson | TranscriptionVerbose,
        "content": {"text/plain": {"schema": {"type": "string"}}},
    },
    **_OPENAI_ERRORS,
}
_ANTHROPIC_STREAMING = {200: {"content": _STREAM}, **_ANTHROPIC_ERRORS}


def _services(request: Request) -> Services:
    return request.app.state.services


def _reply(
    result: BaseModel | Response | AsyncIterator[str] | ApiError, dialect: Dialect
) -> BaseModel | Response:
    if isinstance(result, ApiError):
        return result.response(dialect)
    if isinstance(result, BaseModel | Response):
        return result
    return sse_response(result)


@router.get("/health", tags=["server"])
async def health(request: Request) -> dict[str, str]:
    return {"status": "ok", "model": _services(request).ctx.models.model.name}


@router.get(
    "/metrics", tags=["server"], response_class=Response, responses={200: {"content": {"text/plain": {}}}}
)
async def metrics(request: Request) -> Response:
    body, content_type = _services(request).ctx.metrics.render()
    return Response(body, media_type=content_type)


@router.get("/v1/models", tags=["openai"], responses=_errors(ErrorResponse, 401))
async def list_models(request: Request) -> ModelList:
    return _services(request).model_listing()


@router.get(
    "/v1/models/{model_id:path}",
    tags=["openai"],
    response_model=ModelCard,
    responses=_errors(ErrorResponse, 401, 404),
)
async def get_model(model_id: str, request: Request) -> Any:
    services = _services(request)
    card = services.model_card(model_id)
    if card is None:
        names = [c.id for c in services.model_listing().data]
        return model_not_found(model_id, names).response(Dialect.OPENAI)
    return card


@router.post(
    "/v1/chat/completions",
    tags=["openai"],
    response_model=ChatCompletionResponse,
    responses=_OPENAI_STREAMING,
)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
    result = await _services(request).chat.create(body, disconnect_waiter(request.receive))
    return _reply(result, Dialect.OPENAI)


@router.post(
    "/v1/completions", tags=["openai"], response_model=CompletionResponse, responses=_OPENAI_STREAMING
)
async def completions(body: CompletionRequest, request: Request) -> Any:
    result = await _services(request).completions.create(body, disconnect_waiter(request.receive))
    return _reply(result, Dialect.OPENAI)


@router.post("/v1/responses", tags=["openai"], response_model=ResponseObject, responses=_OPENAI_STREAMING)
async def responses(body: ResponsesRequest, request: Request) -> Any:
    result = await _services(request).responses.create(body, disconnect_waiter(request.receive))
    return _reply(result, Dialect.OPENAI)


@router.post("/v1/embeddings", tags=["openai"], response_model=EmbeddingResponse, responses=_OPENAI_ERRORS)
async def embeddings(body: EmbeddingRequest, request: Request) -> Any:
    return _reply(await _services(request).embeddings.create(body), Dialect.OPENAI)


# a form model holding an UploadFile is still documented as urlencoded unless told otherwise
_MULTIPART = Form(media_type="multipart/form-data")


@router.post(TRANSCRIPTIONS_PATH, tags=["openai"], response_class=Response, responses=_TRANSCRIPTION)
async def audio_transcriptions(form: Annotated[TranscriptionForm, _MULTIPART], request: Request) -> Any:
    result = await _services(request).transcription.create(form, disconnect_waiter(request.receive))
    return _reply(result, Dialect.OPENAI)


# Cohere's v1 and v2 paths and vLLM's bare /rerank all take the same body; unasked fields stay out
_RERANK: dict[str, Any] = {
    "tags": ["rerank"],
    "response_model": RerankResponse,
    "responses": _OPENAI_ERRORS,
    "response_model_exclude_none": True,
}


@router.post("/v1/rerank", **_RERANK)
@router.post("/v2/rerank", **_RERANK)
@router.post("/rerank", **_RERANK)
async def rerank(body: RerankRequest, request: Request) -> Any:
    return _reply(await _services(request).rerank.create(body), Dialect.OPENAI)


@router.post(
    "/v1/messages", tags=["anthropic"], response_model=MessageResponse, responses=_ANTHROPIC_STREAMING
)
async def messages(body: MessagesRequest, request: Request) -> Any:
    result = await _services(request).messages.create(body, disconnect_waiter(request.receive))
    return _reply(result, Dialect.ANTHROPIC)


@router.post(
    "/v1/messages/count_tokens",
    tags=["anthropic"],
    response_model=CountTokensResponse,
    responses=_ANTHROPIC_ERRORS,
)
async def count_tokens(body: CountTokensRequest, request: Request) -> Any:
    return _reply(await _services(request).messages.count_tokens(body), Dialect.ANTHROPIC)


@router.post("/tokenize", tags=["tokens"], response_model=TokenizeResponse, responses=_OPENAI_ERRORS)
async def tokenize(body: TokenizeRequest, request: Request) -> Any:
    services = _services(request)
    return _reply(await services.ctx.prompts.off_loop(services.tokenization.tokenize, body), Dialect.OPENAI)


@router.post("/detokenize", tags=["tokens"], response_model=DetokenizeResponse, responses=_OPENAI_ERRORS)
async def detokenize(body: DetokenizeRequest, request: Request) -> Any:
    return _reply(_services(request).tokenization.detokenize(body), Dialect.OPENAI)
