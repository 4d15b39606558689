"""Small helpers the server tests share: independent token counts and raw SSE parsing."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx


def chat_prompt_tokens(
    http: httpx.Client, messages: list[dict[str, Any]], tools: list[dict] | None = None
) -> int:
    """The prompt length as the server's own /tokenize counts it (template + tokenizer)."""
    body: dict[str, Any] = {"messages": messages}
    if tools:
        body["tools"] = tools
    response = http.post("/tokenize", json=body)
    response.raise_for_status()
    return response.json()["count"]


def sse_events(response: httpx.Response) -> list[tuple[str | None, Any]]:
    """(event name, parsed data) per frame of a finished SSE body; `[DONE]` stays a string.
    Comment frames (`: ping`, sent while the engine is quiet) carry nothing and are skipped, as clients do."""
    events = []
    for block in response.text.split("\n\n"):
        if not block.strip():
            continue
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data.append(line[len("data: ") :])
        if name is None and not data:
            continue
        payload = "\n".join(data)
        events.append((name, payload if payload == "[DONE]" else json.loads(payload)))
    return events


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


# How long a client waits for an answer: a guard against a hung run, never a race against the clock.
# Tests wait for what they are about (an answer, an engine state through `wait_until`); a shared 2-core
# machine at load 5-7 stretches a 10 s request past the 30 s such clients once allowed.
CLIENT_TIMEOUT = 300.0


def wait_until(predicate: Callable[[], bool], timeout: float = CLIENT_TIMEOUT) -> bool:
    """Poll until `predicate()` holds; the deadline only bounds a broken run, it is not what is tested
    (it returns as soon as the predicate holds, so a generous one costs nothing)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
