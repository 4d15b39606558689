"""Server-sent event frames and the streaming response that carries them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel
from starlette.responses import StreamingResponse

DONE = "data: [DONE]\n\n"


def to_json(payload: BaseModel | dict[str, Any]) -> str:
    if isinstance(payload, BaseModel):
        return payload.model_dump_json()
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))


def data_frame(payload: BaseModel | dict[str, Any]) -> str:
    """OpenAI chat/completions style: data lines only, ended by `data: [DONE]`."""
    return f"data: {to_json(payload)}\n\n"


def event_frame(event: str, payload: BaseModel | dict[str, Any]) -> str:
    """Anthropic and Responses style: a named event and its JSON data (which repeats the type)."""
    return f"event: {event}\ndata: {to_json(payload)}\n\n"


# no-cache and no proxy buffering: each frame should reach the client when it is made
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_response(frames: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(frames, media_type="text/event-stream", headers=SSE_HEADERS)
