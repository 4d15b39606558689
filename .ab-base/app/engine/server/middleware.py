"""Admission checks in front of every route, as plain ASGI (so streaming responses pass through untouched).

Order, outermost first: CORS (when configured) -> request metrics -> browser guard (Host 421,
Origin 403, Content-Type 415) -> API key (401) -> then admission.py's: body deadline (408) -> body
size (413) -> requests in flight (429). Each rejection is rendered in the caller's protocol shape.
"""

from __future__ import annotations

import hmac
from collections.abc import Collection
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.engine.server.errors import ApiError, reject, unauthorized

if TYPE_CHECKING:
    from app.engine.server.metrics import ServerMetrics
    from app.engine.server.settings import ServerSettings

# Read without the key: monitors probe /health, and clients and load balancers probe the base URL (GET
# or HEAD /) before they send a key, as vLLM and llama.cpp leave them open. Both tell only the server's
# name, version and model.
OPEN_PATHS = frozenset({"/health", "/"})
OPEN_METHODS = frozenset({"GET", "HEAD"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
# Routes whose bodies are forms (uploads); every other body must be JSON.
FORM_PATHS = frozenset({"/v1/audio/transcriptions"})
FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")
JSON_TYPES = ("application/json",)


def transport_security(settings: ServerSettings) -> TransportSecuritySettings:
    """The Host values this server accepts: the one rule for the API and /mcp alike.

    A wildcard bind (0.0.0.0) can be reached under names the server cannot know: there the Host check
    runs only over the `allowed_hosts` given, and the API key is the guard. The SDK's Origin patterns
    take any port of a loopback name; `BrowserGuardMiddleware` runs first on every route (/mcp too)
    and holds Origin to the server's own one (`is_own_or_allowed_origin`).
    """
    if settings.is_wildcard and not settings.allowed_hosts:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    names = settings.host_names()
    origins = [
        f"{scheme}://{name}{port}" for name in names for scheme in ("http", "https") for port in ("", ":*")
    ]
    return TransportSecuritySettings(
        allowed_hosts=[pattern for name in names for pattern in (name, f"{name}:*")],
        allowed_origins=[*origins, *settings.cors_origins],
    )


_DEFAULT_PORTS = {"http": 80, "https": 443}


def is_own_or_allowed_origin(origin: str | None, host: str | None, allowed: Collection[str]) -> bool:
    """An Origin header is the server's own (the page came from this very host and port, as the Host
    header names it: the Swagger page at /docs) or one the operator allowed with --cors-origin.

    A page on another port of the same machine (a dev server on localhost:3000) is another origin, as
    browsers count them: a multipart upload needs no CORS preflight, so this check is all that stops it.
    No Origin at all is a client that is not a browser page (the Studio, SDKs, curl)."""
    if origin is None:
        return True
    if origin in allowed:
        return True
    try:
        page = urlsplit(origin)
        server = urlsplit(f"{page.scheme}://{host}")
        if page.scheme not in _DEFAULT_PORTS or page.path or not host or not page.hostname:
            return False
        default = _DEFAULT_PORTS[page.scheme]
        return (page.hostname, page.port or default) == (server.hostname, server.port or default)
    except ValueError:  # a port that is not a number, a bracket left open
        return False


class BrowserGuardMiddleware:
    """What keeps a web page from driving the local API.

    A foreign Host header (DNS rebinding) gets 421, by the MCP SDK's own check, and an Origin other than
    the server's own or a --cors-origin gets 403 (`is_own_or_allowed_origin`); a body that is not JSON (a browser sends text/plain or a form without a CORS preflight)
    gets 415, except on the upload routes, which take forms.
    """

    def __init__(
        self, app: ASGIApp, security: TransportSecuritySettings, cors_origins: Collection[str] = ()
    ) -> None:
        self.app = app
        self._check = TransportSecurityMiddleware(security)
        self._cors_origins = frozenset(cors_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        refused = await self._refused_status(scope, headers)
        if refused is not None:
            return await reject(_refusal(refused, headers), scope, receive, send)
        if scope["method"] in BODY_METHODS:
            expected = FORM_TYPES if scope["path"] in FORM_PATHS else JSON_TYPES
            content_type = headers.get("content-type", "")
            if not _media_type_in(content_type, expected):
                return await reject(_unsupported_media_type(content_type, expected), scope, receive, send)
        await self.app(scope, receive, send)

    async def _refused_status(self, scope: Scope, headers: Headers) -> int | None:
        """421 for a foreign Host, 403 for a foreign Origin, None when both are this server's."""
        refused = await self._check.validate_request(Request(scope))
        if refused is not None:
            return refused.status_code
        if not is_own_or_allowed_origin(headers.get("origin"), headers.get("host"), self._cors_origins):
            return 403
        return None


def _media_type_in(content_type: str, expected: tuple[str, ...]) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media in expected or (expected == JSON_TYPES and media.endswith("+json"))


def _refusal(status: int, headers: Headers) -> ApiError:
    if status == 421:
        return ApiError(
            421,
            f"This server does not answer to the Host {headers.get('host')!r} (DNS-rebinding protection).",
            code="misdirected_request",
        )
    return ApiError(
        403,
        f"Requests from the origin {headers.get('origin')!r} are not allowed (start the server with "
        "--cors-origin to allow a web page).",
        code="origin_not_allowed",
    )


def _unsupported_media_type(content_type: str, expected: tuple[str, ...]) -> ApiError:
    given = f"{content_type!r}" if content_type else "no Content-Type"
    return ApiError(
        415, f"The body must be sent as {' or '.join(expected)}, not {given}.", code="unsupported_media_type"
    )


class ApiKeyMiddleware:
    """Accepts `Authorization: Bearer KEY` (OpenAI clients) or `x-api-key: KEY` (Anthropic clients).

    Either header may carry the key; an empty one counts as absent. Keys are compared in constant time.
    """

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or _is_open(scope):
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        authorization = headers.get("authorization", "")
        bearer = authorization[7:].strip() if authorization[:7].lower() == "bearer " else ""
        given = [key for key in (headers.get("x-api-key", "").strip(), bearer) if key]
        # every candidate is compared, so the time taken does not say which header matched
        matches = [hmac.compare_digest(key.encode(), self._key) for key in given]
        if not any(matches):
            return await reject(unauthorized(present=bool(given)), scope, receive, send)
        await self.app(scope, receive, send)


def _is_open(scope: Scope) -> bool:
    return scope["path"] in OPEN_PATHS and scope["method"] in OPEN_METHODS


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
