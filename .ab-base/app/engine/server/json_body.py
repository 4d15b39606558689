"""Large JSON request bodies parsed and validated on the prompt workers, never on the event loop.

FastAPI parses (`json.loads`) and validates a body on the event loop: for a 30 MB body that is a few
hundred milliseconds in which no other client (`/health` included) is answered. `OffLoopJsonRoute`
does both on a worker thread first and hands FastAPI the validated model, which it passes through
unchanged (pydantic does not revalidate an instance of the field's own class). Errors are raised in
the shapes FastAPI itself would give, so every client sees the same 400s either way.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

import pydantic_core
from fastapi import params
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

# Below this a body parses in well under a millisecond: the hop to a worker would cost more.
OFF_LOOP_BYTES = 64 * 1024


def parse_body(model: type[BaseModel], body: bytes) -> BaseModel:
    """The body as `model`, or the RequestValidationError / 400 FastAPI would raise for it.

    pydantic-core's parser runs first (fast, and it holds the interpreter lock only briefly); what it
    refuses (lone surrogates, which JSON allows and it does not; nesting past its limit) goes to
    `json.loads`, FastAPI's own parser, so the result is what FastAPI would have parsed."""
    try:
        data = pydantic_core.from_json(body)
    except ValueError:
        data = _stdlib_json(body)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = [{**error, "loc": ("body", *error["loc"])} for error in exc.errors(include_url=False)]
        raise RequestValidationError(errors, body=data) from exc


def join_and_parse(model: type[BaseModel], chunks: list[bytes]) -> tuple[bytes, BaseModel]:
    body = b"".join(chunks)
    return body, parse_body(model, body)


def _stdlib_json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except json.JSONDecodeError as exc:
        error = {
            "type": "json_invalid",
            "loc": ("body", exc.pos),
            "msg": "JSON decode error",
            "input": {},
            "ctx": {"error": exc.msg},
        }
        raise RequestValidationError([error], body=exc.doc) from exc
    except Exception as exc:  # RecursionError, too many digits, bad UTF-8: FastAPI's answer to each
        raise HTTPException(status_code=400, detail="There was an error parsing the body") from exc


def _is_json(content_type: str | None) -> bool:
    media = (content_type or "application/json").split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def _body_model(route: APIRoute) -> type[BaseModel] | None:
    """The route's one JSON body model, or None (no body, a form, several body parameters)."""
    if route.body_field is None or len(route.dependant.body_params) != 1:
        return None
    if isinstance(route.body_field.field_info, params.Form):
        return None
    annotation = route.body_field.field_info.annotation
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


class OffLoopJsonRoute(APIRoute):
    """An APIRoute whose large JSON body is parsed and validated on the server's prompt workers."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        model = _body_model(self)
        if model is None:
            return handler

        async def parse_off_loop(request: Request) -> Response:
            if not _is_json(request.headers.get("content-type")):
                return await handler(request)
            chunks = [chunk async for chunk in request.stream()]
            size = sum(len(chunk) for chunk in chunks)
            if size < OFF_LOOP_BYTES:
                request._body = b"".join(chunks)
            else:
                # even joining 30 MB of chunks takes the loop 0.1 s on a busy machine: it is done there too.
                # Starlette's Request.body() and .json() return `_body` and `_json` when set; FastAPI then
                # validates the model instance, which pydantic passes through as it is.
                workers = request.app.state.services.ctx.prompts
                request._body, request._json = await workers.off_loop(join_and_parse, model, chunks)
            return await handler(request)

        return parse_off_loop
