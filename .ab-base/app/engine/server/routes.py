"""Thin HTTP routes: parse (pydantic), call the serving layer, map its result to JSON, SSE or an error."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Form, Request, Response
from pydantic import BaseModel

from app import __version__
from app.engine.server.errors import CLIENT_CLOSED, ApiError, Dialect, model_not_found
from app.engine.server.generation import WaitForDisconnect, disconnect_waiter
from app.engine.server.json_body import OffLoopJsonRoute
from app.engine.server.protocol.anthropic import (
    AnthropicErrorResponse,
    CountTokensRequest,
    CountTokensResponse,
    MessageResponse,
    MessagesRequest,
    ModelInfo,
    ModelListResponse,
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
from app.engine.server.sessions import bind_caller
from app.engine.server.sse import sse_response
from app.engine.server.streaming import ANTHROPIC_PING, COMMENT_PING, KeepAliveStream

log = logging.getLogger(__name__)
router = APIRouter(route_class=OffLoopJsonRoute)  # large JSON bodies parse on a worker

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


GenerationResult = BaseModel | Response | AsyncIterator[str] | ApiError


async def _generate(
    request: Request, dialect: Dialect, create: Callable[[WaitForDisconnect], Awaitable[GenerationResult]]
) -> BaseModel | Response:
    """A generation route's answer. A stream opens at once and pings while the engine is quiet
    (the prefill); a client that hangs up is logged, like an access line, as 499 with its wait."""
    started = time.monotonic()
    bind_caller(request)  # the session the engine's fairness sees (sessions.py)
    result = await create(disconnect_waiter(request.receive))
    if isinstance(result, ApiError) and result.status == CLIENT_CLOSED:
        _log_client_closed(request, started)
    if isinstance(result, ApiError | BaseModel | Response):
        return _reply(result, dialect)
    ping = ANTHROPIC_PING if dialect is Dialect.ANTHROPIC else COMMENT_PING
    interval = _services(request).ctx.settings.stream_keepalive_seconds
    return KeepAliveStream(result, ping, interval, partial(_log_client_closed, request, started))


def _log_client_closed(request: Request, started: float) -> None:
    client = request.client
    where = f"{client.host}:{client.port}" if client else "-"
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    log.info(
        '%s - "%s %s" %d client closed the request after %.2f s; generation aborted',
        where, request.method, target, CLIENT_CLOSED, time.monotonic() - started,
    )  # fmt: skip


@router.get("/", tags=["server"])
@router.head("/", tags=["server"], operation_id="root_head")
async def root(request: Request) -> dict[str, str]:
    """What answers here, for clients and probes that check the base URL first."""
    return {
        "name": "Paddock Studio",
        "version": __version__,
        "model": _services(request).ctx.models.model.name,
    }


@router.get("/health", tags=["server"])
async def health(request: Request) -> dict[str, str]:
    return {"status": "ok", "model": _services(request).ctx.models.model.name}


@router.get(
    "/metrics", tags=["server"], response_class=Response, responses={200: {"content": {"text/plain": {}}}}
)
async def metrics(request: Request) -> Response:
    body, content_type = _services(request).ctx.metrics.render()
    return Response(body, media_type=content_type)


def _asks_anthropic(request: Request) -> bool:
    """Anthropic's SDKs (and Claude Code) send `anthropic-version` on every call; OpenAI's never do."""
    return "anthropic-version" in request.headers


_MODELS_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "model": ModelList | ModelListResponse,
        "description": "Anthropic's shape when anthropic-version is sent",
    }
}


@router.get(
    "/v1/models",
    tags=["openai", "anthropic"],
    response_model=None,
    responses={**_MODELS_RESPONSES, **_errors(ErrorResponse, 401)},
)
async def list_models(request: Request) -> ModelList | ModelListResponse:
    services = _services(request)
    return services.ctx.models.anthropic_listing() if _asks_anthropic(request) else services.model_listing()


@router.get(
    "/v1/models/{model_id:path}",
    tags=["openai", "anthropic"],
    response_model=None,
    responses={200: {"model": ModelCard | ModelInfo}, **_errors(ErrorResponse, 401, 404)},
)
async def get_model(model_id: str, request: Request) -> Any:
    services = _services(request)
    if _asks_anthropic(request):
        card: Any = services.ctx.models.anthropic_card(model_id)
        names, dialect = services.ctx.models.chat_names, Dialect.ANTHROPIC
    else:
        card = services.model_card(model_id)
        names, dialect = [c.id for c in services.model_listing().data], Dialect.OPENAI
    return card if card is not None else model_not_found(model_id, names).response(dialect)


@router.post(
    "/v1/chat/completions",
    tags=["openai"],
    response_model=ChatCompletionResponse,
    responses=_OPENAI_STREAMING,
)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
    return await _generate(request, Dialect.OPENAI, partial(_services(request).chat.create, body))


@router.post(
    "/v1/completions", tags=["openai"], response_model=CompletionResponse, responses=_OPENAI_STREAMING
)
async def completions(body: CompletionRequest, request: Request) -> Any:
    return await _generate(request, Dialect.OPENAI, partial(_services(request).completions.create, body))


@router.post("/v1/responses", tags=["openai"], response_model=ResponseObject, responses=_OPENAI_STREAMING)
async def responses(body: ResponsesRequest, request: Request) -> Any:
    return await _generate(request, Dialect.OPENAI, partial(_services(request).responses.create, body))


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
    return await _generate(request, Dialect.ANTHROPIC, partial(_services(request).messages.create, body))


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
