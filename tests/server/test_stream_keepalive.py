"""Streams open before the prefill ends and ping while it runs; a hang-up during the prefill frees its KV blocks.

The fake engine holds every request in its "prefill" while `prefill_gate` is closed, so a test knows
the prefill has not ended when the first bytes and the pings arrive. The disconnect test also runs on
the embedded model with a long prompt, where the prefill is real work on the CPU.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .conftest import running_server
from .fakes import FakeEngine
from .helpers import CLIENT_TIMEOUT, wait_until

KEEPALIVE = 0.05  # seconds: small, so a test sees pings at once
ANTHROPIC_PING = 'event: ping\ndata: {"type":"ping"}'
COMMENT_PING = ": ping"


def frames(response: httpx.Response) -> Iterator[str]:
    """Raw SSE frames (the lines of one event, joined), as they arrive."""
    lines: list[str] = []
    for line in response.iter_lines():
        if line:
            lines.append(line)
        elif lines:
            yield "\n".join(lines)
            lines = []


def bodies(model: str, prompt: str) -> dict[str, tuple[str, dict[str, Any]]]:
    turn = [{"role": "user", "content": prompt}]
    return {
        "anthropic": ("/v1/messages", {"model": model, "max_tokens": 400, "stream": True, "messages": turn}),
        "chat": ("/v1/chat/completions", {"model": model, "max_tokens": 400, "stream": True, "messages": turn}),
        "responses": ("/v1/responses", {"model": model, "max_output_tokens": 400, "stream": True, "input": prompt}),
        "completions": ("/v1/completions", {"model": model, "max_tokens": 400, "stream": True, "prompt": prompt}),
    }  # fmt: skip


# protocol -> (what the first frame starts with, the ping it sends)
OPENING = {
    "anthropic": ("event: message_start", ANTHROPIC_PING),
    "chat": ('data: {"id":"chatcmpl-', COMMENT_PING),
    "responses": ("event: response.created", COMMENT_PING),
    "completions": (COMMENT_PING, COMMENT_PING),  # no role chunk in this protocol: a ping is the first byte
}


@pytest.fixture
def gated(engine: Any) -> Iterator[threading.Event]:
    if not isinstance(engine, FakeEngine):
        pytest.skip("holds the fake engine's prefill open")
    engine.prefill_gate = gate = threading.Event()
    try:
        yield gate
    finally:
        gate.set()
        engine.prefill_gate = None


@pytest.mark.parametrize("protocol", list(OPENING))
def test_first_bytes_and_pings_arrive_while_the_prefill_runs(engine, gated, model_name, protocol):
    path, body = bodies(model_name, "Hello")[protocol]
    first, ping = OPENING[protocol]
    with (
        running_server(engine, stream_keepalive_seconds=KEEPALIVE) as server,
        httpx.Client(base_url=server.base_url, timeout=CLIENT_TIMEOUT) as client,
        client.stream("POST", path, json=body) as response,
    ):
        assert response.status_code == 200
        stream = frames(response)
        assert next(stream).startswith(first)
        pings = 0
        while pings < 3:  # Anthropic's own opening ping included, three pings prove the keep-alive
            frame = next(stream)
            pings += frame == ping
        assert engine.stats().requests_running == 1  # still in its prefill: no token was made yet
        gated.set()
        rest = list(stream)
    assert streamed_text(protocol, rest) == "Echo: Hello"
    assert rest[-1].startswith(LAST[protocol])


LAST = {
    "anthropic": "event: message_stop",
    "chat": "data: [DONE]",
    "responses": "event: response.completed",
    "completions": "data: [DONE]",
}


def streamed_text(protocol: str, raw: list[str]) -> str:
    """The generated text carried by a protocol's delta events."""
    text = ""
    for frame in raw:
        data = next((line[6:] for line in frame.split("\n") if line.startswith("data: ")), None)
        if data is None or data == "[DONE]":
            continue
        event = json.loads(data)
        if protocol == "anthropic" and event["type"] == "content_block_delta":
            text += event["delta"].get("text", "")
        elif protocol == "chat" and event["choices"]:
            text += event["choices"][0]["delta"].get("content") or ""
        elif protocol == "responses" and event["type"] == "response.output_text.delta":
            text += event["delta"]
        elif protocol == "completions" and event["choices"]:
            text += event["choices"][0]["text"]
    return text


# a 3,000-word prefill on the embedded model is ~10-15 CPU-seconds, so its runs are the slow tier's: in the fast
# tier the fake engine's runs show both protocols' route handling, test_disconnect_and_concurrency.py the real
# engine's abort through the routes and test_scheduler.py an abort freeing a prefilling request's blocks
@pytest.mark.slow_on_embedded
@pytest.mark.parametrize("protocol", ["anthropic", "chat"])
def test_a_disconnect_during_the_prefill_frees_the_requests_blocks(engine, model_name, protocol, caplog):
    fake = isinstance(engine, FakeEngine)
    if fake:
        engine.prefill_gate = threading.Event()  # never opened: the request stays in its prefill
    # on the embedded model, a prompt of more than one step's tokens: its prefill takes two steps
    prompt = "Hello" if fake else f"{protocol} " + "word " * 3000
    path, body = bodies(model_name, prompt)[protocol]
    before = engine.stats()
    try:
        with (
            caplog.at_level(logging.INFO, logger="app.engine.server.routes"),
            running_server(engine, stream_keepalive_seconds=KEEPALIVE) as server,
        ):
            with (
                httpx.Client(base_url=server.base_url, timeout=CLIENT_TIMEOUT) as client,
                client.stream("POST", path, json=body) as response,
            ):
                assert response.status_code == 200
                stream = frames(response)  # kept: closing the generator would close the response
                next(stream)
                assert wait_until(lambda: engine.stats().requests_running == 1)
            # the client is gone: the request is aborted and its blocks go back (the bound only ends a broken run:
            # the step in progress finishes first, and one step of a long prompt is slow on a shared CPU)
            assert wait_until(
                lambda: engine.stats().requests_running == 0 and engine.stats().kv_blocks_used == 0,
                timeout=300,
            )
            assert wait_until(lambda: any(" 499 " in r.getMessage() for r in caplog.records))
            prompt_tokens = httpx.post(
                f"{server.base_url}/tokenize", json={"messages": body.get("messages")}
            ).json()["count"]
    finally:
        if fake:
            engine.prefill_gate = None
    logged = next(r.getMessage() for r in caplog.records if " 499 " in r.getMessage())
    assert f'"POST {path}" 499 client closed the request after ' in logged
    if not fake:  # the abort landed after the step in progress: the prefill never ended, no token was made
        after, budget = engine.stats(), engine.engine.config.max_num_batched_tokens
        assert prompt_tokens > budget
        assert after.prompt_tokens_total - before.prompt_tokens_total <= budget
        assert after.generation_tokens_total == before.generation_tokens_total
