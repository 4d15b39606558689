"""Client errors as values, rendered in each protocol's own error shape.

Serving code raises `ApiError` internally and returns it at its boundary; routes and
middleware render it as OpenAI's `{"error": {message, type, param, code}}` or
Anthropic's `{"type": "error", "error": {type, message}}`, chosen by the request path.
"""

from __future__ import annotations

import enum
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from app.engine import ContextOverflowError

log = logging.getLogger(__name__)


class Dialect(enum.Enum):
    OPENAI = "openai"
    ANTHROPIC = "anthropic"


# status -> (OpenAI error type, Anthropic error type)
_ERROR_TYPES: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "invalid_request_error"),
    401: ("authentication_error", "authentication_error"),
    403: ("permission_error", "permission_error"),
    404: ("invalid_request_error", "not_found_error"),
    405: ("invalid_request_error", "invalid_request_error"),
    408: ("invalid_request_error", "invalid_request_error"),  # a body that did not arrive in time
    413: ("invalid_request_error", "request_too_large"),
    415: ("invalid_request_error", "invalid_request_error"),  # a body sent as a form or text, not JSON
    421: ("invalid_request_error", "invalid_request_error"),  # a Host this server does not answer to
    429: ("rate_limit_error", "rate_limit_error"),
    503: ("server_error", "overloaded_error"),
}
_SERVER_ERROR_TYPES = ("server_error", "api_error")


class ApiError(Exception):
    """A request that cannot be served, with the HTTP status and the words a client needs."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        anthropic_message: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.anthropic_message = anthropic_message or message  # where Anthropic words it differently
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self, dialect: Dialect) -> dict[str, Any]:
        openai_type, anthropic_type = _ERROR_TYPES.get(self.status, _SERVER_ERROR_TYPES)
        if dialect is Dialect.ANTHROPIC:
            return {"type": "error", "error": {"type": anthropic_type, "message": self.anthropic_message}}
        return {
            "error": {"message": self.message, "type": openai_type, "param": self.param, "code": self.code}
        }

    def response(self, dialect: Dialect) -> JSONResponse:
        return JSONResponse(self.body(dialect), status_code=self.status, headers=self.headers)

    def __repr__(self) -> str:
        return f"ApiError({self.status}, {self.message!r})"


def dialect_for_path(path: str) -> Dialect:
    return Dialect.ANTHROPIC if path.startswith("/v1/messages") else Dialect.OPENAI


# Set in a request's scope by the middleware that answered it itself (admission.py): the route then
# sees the client as gone, which is not the client's doing and not worth a log line.
REFUSED_KEY = "paddock.refused"


async def reject(error: ApiError, scope: Scope, receive: Receive, send: Send) -> None:
    """Answer a request with `error` from ASGI middleware, in the protocol shape of its path."""
    await error.response(dialect_for_path(scope["path"]))(scope, receive, send)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


CLIENT_CLOSED = 499  # nginx's "client closed request": nobody reads it, the metrics count it


def client_closed(message: str = "Client closed the request.") -> ApiError:
    """The client hung up before a non-streaming response was ready."""
    return ApiError(CLIENT_CLOSED, message)


def model_not_found(model: str, available: list[str]) -> ApiError:
    return ApiError(
        404,
        f"The model {model!r} does not exist. Available models: {', '.join(available) or 'none'}.",
        param="model",
        code="model_not_found",
    )


def context_overflow(exc: ContextOverflowError, param: str = "messages") -> ApiError:
    """OpenAI clients get vLLM's sentence; Anthropic clients get Anthropic's own words, which
    Claude Code parses to retry with a smaller max_tokens."""
    if exc.prompt_tokens > exc.context_length:
        anthropic = f"prompt is too long: {exc.prompt_tokens} tokens > {exc.context_length} maximum"
    else:
        anthropic = (
            f"input length and `max_tokens` exceed context limit: {exc.prompt_tokens} + {exc.max_tokens} > "
            f"{exc.context_length}, decrease input length or `max_tokens` and try again"
        )
    return ApiError(400, str(exc), param=param, code="context_length_exceeded", anthropic_message=anthropic)


def body_too_large(limit: int) -> ApiError:
    return ApiError(
        413, f"Request body is larger than the server's limit of {limit} bytes.", code="request_too_large"
    )


def request_timeout(seconds: float) -> ApiError:
    """The body did not arrive whole in time; the connection is closed after this answer."""
    return ApiError(
        408,
        f"The request body did not arrive within the server's {seconds:g} s; the connection is closed.",
        code="request_timeout",
        headers={"Connection": "close"},
    )


def too_many_requests(limit: int, retry_after: int) -> ApiError:
    return ApiError(
        429,
        f"Too many requests in flight (the server's limit is {limit}); retry after {retry_after} s.",
        code="rate_limit_exceeded",
        headers={"Retry-After": str(retry_after)},
    )


def unauthorized(present: bool) -> ApiError:
    reason = (
        "Incorrect API key provided."
        if present
        else "Missing API key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'."
    )
    return ApiError(401, reason, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def describe_validation_errors(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """One readable sentence (and the first offending parameter) from pydantic's error list."""
    if not errors:
        return "Invalid request.", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "not valid JSON")
        return f"Malformed JSON in the request body: {detail}.", None
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    if not loc and first.get("type") in ("missing", "model_attributes_type", "dict_type"):
        return "The request body must be a JSON object.", None
    param = _param_path(loc)
    more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    return f"Invalid value for '{param}': {first.get('msg', 'invalid')}{more}.", param or None


def _param_path(loc: list[str]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if part.isdigit() else (f".{part}" if path else part)
    return path


def install_error_handlers(app: FastAPI) -> None:
    """Every error the framework produces comes out in the caller's protocol shape."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response(dialect_for_path(request.url.path))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = describe_validation_errors(list(exc.errors()))
        return bad_request(message, param=param).response(dialect_for_path(request.url.path))

    @app.exception_handler(ClientDisconnect)
    async def _disconnected(request: Request, exc: ClientDisconnect) -> JSONResponse:
        return _client_left(request)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if isinstance(exc.__cause__, ClientDisconnect):  # FastAPI's 400 for a form cut off mid-upload
            return _client_left(request)
        message = exc.detail if isinstance(exc.detail, str) else "HTTP error"
        if exc.status_code == 404:
            message = f"No such endpoint: {request.method} {request.url.path}"
        error = ApiError(exc.status_code, message, headers=dict(exc.headers or {}))
        return error.response(dialect_for_path(request.url.path))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error serving %s", request.url.path)
        error = ApiError(500, f"Internal server error: {type(exc).__name__}: {exc}")
        return error.response(dialect_for_path(request.url.path))


def _client_left(request: Request) -> JSONResponse:
    """A client that hung up while sending its body (an aborted upload): one line, like an access line,
    and a 499 that nobody reads but /metrics counts. (Not a 500 with two tracebacks, as it was.)"""
    if not request.scope.get(REFUSED_KEY):
        client = request.client
        where = f"{client.host}:{client.port}" if client else "-"
        log.info(
            '%s - "%s %s" %d client closed the request while sending its body',
            where, request.method, request.url.path, CLIENT_CLOSED,
        )  # fmt: skip
    message = "The client closed the connection before its request body was whole."
    return client_closed(message).response(dialect_for_path(request.url.path))
