"""A client that hangs up cancels its generation; many concurrent clients share the engine's batches."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .helpers import CLIENT_TIMEOUT, wait_until

pytestmark = pytest.mark.usefixtures("scripted")  # exact answers come from the fake engine (fakes.py)

FOREVER = [{"role": "user", "content": "forever"}]


def test_closing_a_stream_aborts_its_generation(server, engine, model_name):
    body = {"model": model_name, "stream": True, "max_tokens": 1000, "messages": FOREVER}
    with (
        httpx.Client(base_url=server.base_url, timeout=CLIENT_TIMEOUT) as http,
        http.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        lines = response.iter_lines()
        next(lines)
        request_id = engine.requests[-1].request_id
        assert request_id not in engine.closed_early
    # leaving the blocks closed the connection mid-stream
    assert wait_until(lambda: request_id in engine.closed_early and request_id in engine.aborted)


def test_closing_an_anthropic_stream_aborts_too(server, engine, model_name):
    body = {"model": model_name, "stream": True, "max_tokens": 1000, "messages": FOREVER}
    with (
        httpx.Client(base_url=server.base_url, timeout=CLIENT_TIMEOUT) as http,
        http.stream("POST", "/v1/messages", json=body) as response,
    ):
        lines = response.iter_lines()
        next(lines)
        request_id = engine.requests[-1].request_id
    assert wait_until(lambda: request_id in engine.aborted)


def test_hanging_up_on_a_non_streaming_request_aborts_it(server, engine, model_name):
    count = len(engine.requests)
    body = {"model": model_name, "max_tokens": 1000, "messages": FOREVER}
    with contextlib.suppress(httpx.ReadTimeout):  # the client gives up and closes the connection
        httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=httpx.Timeout(30, read=0.3))
    assert wait_until(lambda: len(engine.requests) > count)
    request_id = engine.requests[count].request_id
    assert wait_until(lambda: request_id in engine.aborted and request_id in engine.closed_early)


def test_sixteen_streaming_clients_are_batched_together(server, engine, model_name, http):
    engine.batch_barrier = 16  # each fake generation waits until 16 are running at once

    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[str, object]:
        stream = await client.chat.completions.create(
            model=model_name,
            messages=[{"role": "user", "content": f"batch-together {i}"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage:
                usage = chunk.usage
        return text, usage

    async def run_all() -> list[tuple[str, object]]:
        client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0, timeout=CLIENT_TIMEOUT)
        try:
            return await asyncio.gather(*(one(client, i) for i in range(16)))
        finally:
            await client.close()

    results = asyncio.run(run_all())
    for i, (text, usage) in enumerate(results):
        assert text == f"Echo: batch-together {i}"
        prompt = http.post(
            "/tokenize", json={"messages": [{"role": "user", "content": f"batch-together {i}"}]}
        )
        assert usage.prompt_tokens == prompt.json()["count"]
        assert usage.completion_tokens == len(text) + 1
    samples = {
        s.name: s.value for f in text_string_to_metric_families(http.get("/metrics").text) for s in f.samples
    }
    assert samples["paddock_engine_batch_size_max"] >= 16
