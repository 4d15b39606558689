"""Admission checks in front of every route, as plain ASGI (so streaming responses pass through untouched).

Order, outermost first: request metrics -> API key (401) -> body size (413) ->
requests in flight (429). Each rejection is rendered in the caller's protocol shape.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.engine.server.errors import (
    ApiError,
    body_too_large,
    dialect_for_path,
    too_many_requests,
    unauthorized,
)

if TYPE_CHECKING:
    from app.engine.server.metrics import ServerMetrics

# Endpoints that run the engine, the embedder or Whisper (MCP tool calls too): these count against
# max_concurrent_requests.
LIMITED_PATHS = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/messages",
        "/v1/embeddings",
        "/v1/audio/transcriptions",
        "/v1/rerank",
        "/v2/rerank",
        "/rerank",
        "/mcp",
    }
)
OPEN_PATHS = frozenset({"/health", "/metrics", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})


async def _reject(error: ApiError, scope: Scope, receive: Receive, send: Send) -> None:
    await error.response(dialect_for_path(scope["path"]))(scope, receive, send)


class ApiKeyMiddleware:
    """Accepts `Authorization: Bearer KEY` (OpenAI clients) or `x-api-key: KEY` (Anthropic clients)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        given = headers.get("x-api-key")
        authorization = headers.get("authorization", "")
        if given is None and authorization[:7].lower() == "bearer ":
            given = authorization[7:].strip()
        if given is None or not hmac.compare_digest(given.encode(), self._key):
            return await _reject(unauthorized(present=given is not None), scope, receive, send)
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """Reads request bodies up to the cap before any route sees them; larger ones get 413.

    `route_limits` gives some paths their own cap (audio uploads are far larger than JSON).
    """

    def __init__(self, app: ASGIApp, max_bytes: int, route_limits: Mapping[str, int] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.route_limits = dict(route_limits or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        limit = self.route_limits.get(scope["path"], self.max_bytes)
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return await _reject(body_too_large(limit), scope, receive, send)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return await _reject(body_too_large(limit), scope, receive, send)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The buffered body first, then the real channel (which later reports the disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay


class ConcurrencyLimitMiddleware:
    def __init__(self, app: ASGIApp, limit: int, retry_after: int, metrics: ServerMetrics) -> None:
        self.app = app
        self.limit = limit
        self.retry_after = retry_after
        self.metrics = metrics
        self.in_flight = 0  # touched only on the event loop's thread

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in LIMITED_PATHS:
            return await self.app(scope, receive, send)
        if self.in_flight >= self.limit:
            return await _reject(too_many_requests(self.limit, self.retry_after), scope, receive, send)
        self.in_flight += 1
        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
            self.metrics.in_flight.dec()


class RequestMetricsMiddleware:
    """Counts requests by endpoint and status (unknown paths share one label, to bound cardinality)."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics, known_paths: frozenset[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.known_paths = known_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status: dict[str, Any] = {"code": 500}

        async def record(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, record)
        finally:
            path = scope["path"] if scope["path"] in self.known_paths else "other"
            self.metrics.requests.labels(path, str(status["code"])).inc()
