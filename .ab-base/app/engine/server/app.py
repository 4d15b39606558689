"""The app factory: one FastAPI app over one engine (and optionally an embedder)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from app.engine import EngineClient
from app.engine.server.admission import (
    BodyDeadlineMiddleware,
    BodyLimitMiddleware,
    ConcurrencyLimitMiddleware,
)
from app.engine.server.embedder import Embedder
from app.engine.server.errors import install_error_handlers
from app.engine.server.middleware import (
    ApiKeyMiddleware,
    BrowserGuardMiddleware,
    RequestMetricsMiddleware,
    transport_security,
)
from app.engine.server.routes import router
from app.engine.server.services import Services
from app.engine.server.serving_audio import (
    TRANSCRIPTIONS_PATH,
    TranscriberChoice,
    resolve_transcriber,
)
from app.engine.server.settings import ServerSettings
from app.engine.tasks.rerank import Reranker

log = logging.getLogger(__name__)

API_VERSION = "0.1.0"
MCP_PATH = "/mcp"


def create_app(
    engine: EngineClient,
    *,
    embedder: Embedder | None = None,
    settings: ServerSettings | None = None,
    transcriber: TranscriberChoice = "embedded",
    reranker: Reranker | None = None,
    speech_models: Sequence[Any] = (),
) -> FastAPI:
    """Build the app. It does not own the engine: shutting the app down leaves the engine running.

    `transcriber` serves /v1/audio/transcriptions: "embedded" (Whisper tiny.en, loaded on the
    first request), a Transcriber to share (the Studio's, or a test's), or None for no audio.
    `reranker` scores /v1/rerank (a Qwen3-Reranker loaded beside the model); None: the embedder's cosines.
    `speech_models`: speech LLMs (Qwen3-ASR, Granite Speech, Gemma 4 with audio) that /v1/audio/transcriptions
    also serves, by their names.
    """
    settings = settings or ServerSettings()
    services = Services.build(
        engine, embedder, settings, resolve_transcriber(transcriber), reranker, speech_models
    )
    mcp_server = None
    if settings.enable_mcp:
        from app.engine.server.mcp import build_mcp_server

        mcp_server = build_mcp_server(services)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            if mcp_server is not None:
                await stack.enter_async_context(mcp_server.session_manager.run())
            yield

    app = FastAPI(
        title="Paddock Studio local API",
        version=API_VERSION,
        description="OpenAI- and Anthropic-compatible API over the Paddock engine.",
        lifespan=lifespan,
        strict_content_type=False,  # BrowserGuardMiddleware answers a body that is not JSON with 415
    )
    app.state.services = services
    install_error_handlers(app)
    app.include_router(router)
    if mcp_server is not None:
        _mount_mcp(app, mcp_server, settings)
    known_paths = frozenset(getattr(route, "path", "") for route in [*app.routes, *router.routes])
    metrics = services.ctx.metrics
    # add_middleware wraps what is there: the last added runs first
    app.add_middleware(ConcurrencyLimitMiddleware, limit=settings.max_concurrent_requests,
                       retry_after=settings.retry_after_seconds, metrics=metrics,
                       route_limits={TRANSCRIPTIONS_PATH: settings.max_concurrent_uploads})  # fmt: skip
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes,
                       route_limits={TRANSCRIPTIONS_PATH: settings.max_audio_body_bytes})  # fmt: skip
    app.add_middleware(BodyDeadlineMiddleware, seconds=settings.body_timeout_seconds,
                       route_seconds={TRANSCRIPTIONS_PATH: settings.upload_timeout_seconds})  # fmt: skip
    if settings.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=settings.api_key)
    app.add_middleware(
        BrowserGuardMiddleware, security=transport_security(settings), cors_origins=settings.cors_origins
    )
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics, known_paths=known_paths)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=["*"],
            allow_headers=["*"],
        )
    _describe_errors_as_400(app)
    return app


def _mount_mcp(app: FastAPI, mcp_server: Any, settings: ServerSettings) -> None:
    """The MCP endpoint as a route at exactly /mcp (a Mount would redirect /mcp to /mcp/)."""
    mcp_app = mcp_server.streamable_http_app(
        streamable_http_path=MCP_PATH,
        stateless_http=True,
        json_response=True,
        max_request_body_size=settings.max_body_bytes,
        transport_security=transport_security(settings),  # the same rule BrowserGuardMiddleware applies
        host=settings.host,
    )
    app.router.routes.extend(mcp_app.routes)


def _describe_errors_as_400(app: FastAPI) -> None:
    """Validation errors are answered with 400 in each protocol's shape, so the schema drops FastAPI's 422."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = FastAPI.openapi(app)
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
