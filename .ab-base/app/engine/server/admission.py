"""What a request body must do to be served, as plain ASGI wrappers of `receive`: arrive in time (408),
stay under its size cap (413), and find a free slot once it is whole (429).

A slow client costs a socket here, never a slot: issue 40's 256 connections trickling their bodies
held all 256 in-flight slots, and every chat call got 429 for as long as they stayed. Now a slot is
taken when the last body byte arrives (before the route can start any work), and a body that does not
arrive whole within its deadline is answered 408 and its connection closed. (Slow request headers
are `http_protocol.py`'s.)

Each refusal is sent by the wrapper that decides it; the route then sees the client as gone
(`http.disconnect`) and whatever it answers is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import anyio
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.engine.server.errors import (
    REFUSED_KEY,
    ApiError,
    body_too_large,
    reject,
    request_timeout,
    too_many_requests,
)
from app.engine.server.middleware import BODY_METHODS

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
DISCONNECT: Message = {"type": "http.disconnect"}


def _body_ends(message: Message) -> bool:
    return message["type"] == "http.request" and not message.get("more_body", False)


_ANSWER_KEY = "paddock.refusable"


class _Refusable:
    """The `send` of one request that a wrapper may answer itself: once it has, the app's own
    messages are dropped (the app is told the client left). The wrappers of a request share one
    (`of`): every frame of a stream passes through it once, not once for each wrapper."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.refused = False
        self.started = False  # the app began its own answer: too late to send another

    @classmethod
    def of(cls, scope: Scope, send: Send) -> _Refusable:
        """The request's one answer, made by the outermost wrapper around `send` as it found it."""
        answer = scope.get(_ANSWER_KEY)
        if answer is None:
            answer = scope[_ANSWER_KEY] = cls(send)
        return answer

    async def refuse(self, error: ApiError, scope: Scope, receive: Receive) -> Message:
        self.refused = True
        scope[REFUSED_KEY] = True
        if not self.started:
            await reject(error, scope, receive, self._send)
        return DISCONNECT

    async def send(self, message: Message) -> None:
        if self.refused:
            return
        self.started = self.started or message["type"] == "http.response.start"
        await self._send(message)


async def _run(app: ASGIApp, scope: Scope, receive: Receive, answer: _Refusable) -> None:
    try:
        await app(scope, receive, answer.send)
    except Exception:
        if not answer.refused:  # a route failing on the disconnect it was handed is not news
            raise


class BodyDeadlineMiddleware:
    """A request body must arrive whole within `seconds` (some paths get `route_seconds`) of its headers;
    past that the client gets 408 with `Connection: close`. Waiting after the body (for the client to
    hang up, while a reply streams) has no deadline."""

    def __init__(
        self, app: ASGIApp, seconds: float, route_seconds: Mapping[str, float] | None = None
    ) -> None:
        self.app = app
        self.seconds = seconds
        self.route_seconds = dict(route_seconds or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS:
            return await self.app(scope, receive, send)
        seconds = self.route_seconds.get(scope["path"], self.seconds)
        deadline = anyio.current_time() + seconds
        answer = _Refusable.of(scope, send)
        whole = False

        async def timed() -> Message:
            nonlocal whole
            if answer.refused:
                return DISCONNECT
            if whole:
                return await receive()
            with anyio.move_on_after(deadline - anyio.current_time()):
                message = await receive()
                whole = message["type"] != "http.request" or _body_ends(message)
                return message
            return await answer.refuse(request_timeout(seconds), scope, receive)

        await _run(self.app, scope, timed, answer)


class BodyLimitMiddleware:
    """Counts request body bytes as they arrive; past the cap the client gets 413 and the route a disconnect.

    Nothing is buffered here: the route reads the body as it would without the cap (uploads spool to
    disk), so a body is never held whole before it is known to fit. `route_limits` gives some paths
    their own cap (audio uploads are far larger than JSON).
    """

    def __init__(self, app: ASGIApp, max_bytes: int, route_limits: Mapping[str, int] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.route_limits = dict(route_limits or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS:
            return await self.app(scope, receive, send)
        limit = self.route_limits.get(scope["path"], self.max_bytes)
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return await reject(body_too_large(limit), scope, receive, send)
        answer = _Refusable.of(scope, send)
        size = 0

        async def counted() -> Message:
            nonlocal size
            if answer.refused:
                return DISCONNECT
            message = await receive()
            if message["type"] == "http.request":
                size += len(message.get("body", b""))
                if size > limit:
                    return await answer.refuse(body_too_large(limit), scope, receive)
            return message

        await _run(self.app, scope, counted, answer)


class ConcurrencyLimitMiddleware:
    """Requests in flight on the limited paths, capped in all (`limit`) and per route (`route_limits`).

    A request takes its slot when its body is whole, which is before its route can start any work (a
    route reads its body first): a client still sending holds no slot, however slow it is."""

    def __init__(
        self,
        app: ASGIApp,
        limit: int,
        retry_after: int,
        metrics: ServerMetrics,
        route_limits: Mapping[str, int] | None = None,
    ) -> None:
        self.app = app
        self.limit = limit
        self.retry_after = retry_after
        self.metrics = metrics
        self.route_limits = dict(route_limits or {})
        self.in_flight = 0  # touched only on the event loop's thread
        self.in_flight_by_route = dict.fromkeys(self.route_limits, 0)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in LIMITED_PATHS:
            return await self.app(scope, receive, send)
        path = scope["path"]
        answer = _Refusable.of(scope, send)
        held = False

        async def admitted() -> Message:
            nonlocal held
            if answer.refused:
                return DISCONNECT
            message = await receive()
            if not held and _body_ends(message):
                refusal = self._full(path)
                if refusal is not None:
                    return await answer.refuse(refusal, scope, receive)
                self._take(path)
                held = True
            return message

        try:
            await _run(self.app, scope, admitted, answer)
        finally:
            if held:
                self._release(path)

    def _full(self, path: str) -> ApiError | None:
        """The 429 for a request whose body just ended, or None when a slot is free."""
        if self.in_flight >= self.limit:
            return too_many_requests(self.limit, self.retry_after)
        route_limit = self.route_limits.get(path)
        if route_limit is not None and self.in_flight_by_route[path] >= route_limit:
            return too_many_requests(route_limit, self.retry_after)
        return None

    def _take(self, path: str) -> None:
        self.in_flight += 1
        if path in self.in_flight_by_route:
            self.in_flight_by_route[path] += 1
        self.metrics.in_flight.inc()

    def _release(self, path: str) -> None:
        self.in_flight -= 1
        if path in self.in_flight_by_route:
            self.in_flight_by_route[path] -= 1
        self.metrics.in_flight.dec()
