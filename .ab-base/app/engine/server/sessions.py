"""Who a request comes from, for the scheduler's round-robin fairness (`GenerationRequest.session_id`).

A session is: the API key the request carried (hashed: keys never reach logs or the engine)
together with the user the body names (OpenAI `user`, Anthropic `metadata.user_id`) when it
names one; with neither, the HTTP connection (client address and port: one keep-alive client).
The route sets the caller for its task (`bind_caller`); `session_id` reads it where the serving
layer builds the engine request, so no serving class needs the HTTP request itself.
"""

from __future__ import annotations

import hashlib
from contextvars import ContextVar
from dataclasses import dataclass

from starlette.requests import Request


@dataclass(frozen=True)
class Caller:
    key_hash: str | None  # first 16 hex digits of the key's sha256
    connection: str  # "host:port", or "unknown"


_caller: ContextVar[Caller | None] = ContextVar("paddock_caller", default=None)


def caller_of(request: Request) -> Caller:
    headers = request.headers
    authorization = headers.get("authorization", "")
    key = headers.get("x-api-key", "").strip() or (
        authorization[7:].strip() if authorization[:7].lower() == "bearer " else ""
    )
    key_hash = hashlib.sha256(key.encode()).hexdigest()[:16] if key else None
    client = request.client
    return Caller(key_hash, f"{client.host}:{client.port}" if client else "unknown")


def bind_caller(request: Request) -> None:
    """Remember the request's caller for the rest of this task (one request per task)."""
    _caller.set(caller_of(request))


def session_id(user: str | None) -> str:
    """The fairness key for a request naming `user` (or none), from the bound caller."""
    caller = _caller.get()
    parts = [f"key:{caller.key_hash}"] if caller and caller.key_hash else []
    if user:
        parts.append(f"user:{user}")
    if parts:
        return "|".join(parts)
    return f"conn:{caller.connection}" if caller else "default"
