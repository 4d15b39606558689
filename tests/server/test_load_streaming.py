"""Many concurrent streaming clients on loopback, a third hanging up at random: no 5xx, no KV block
left in use, and exact usage on every stream that completed (issue 24's load line)."""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from .fakes import FakeEngine
from .helpers import chat_prompt_tokens, wait_until

CHAT = "/v1/chat/completions"


@dataclass
class Outcome:
    status: int
    hung_up: bool
    messages: list[dict[str, Any]]
    usage: dict[str, Any] | None = None
    tokens_seen: int = 0  # logprob entries streamed: one per generated token


async def stream_one(
    client: httpx.AsyncClient, model: str, index: int, hang_up_after: int | None, max_tokens: int
) -> Outcome:
    messages = [{"role": "user", "content": f"load test client {index}"}]
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logprobs": True,
    }
    async with client.stream("POST", CHAT, json=body) as response:
        outcome = Outcome(response.status_code, hang_up_after is not None, messages)
        if response.status_code != 200:
            await response.aread()
            return outcome
        frames = 0
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            frames += 1
            if hang_up_after is not None and frames >= hang_up_after:
                return outcome  # leaving the block closes the connection mid-stream
            chunk = json.loads(line[len("data: ") :])
            assert "error" not in chunk, chunk
            for choice in chunk["choices"]:
                outcome.tokens_seen += len((choice.get("logprobs") or {}).get("content") or [])
            if chunk.get("usage"):
                outcome.usage = chunk["usage"]
    return outcome


def run_clients(base_url: str, model: str, clients: int, max_tokens: int, seed: int) -> list[Outcome]:
    chooser = random.Random(seed)
    hang_ups = set(chooser.sample(range(clients), clients // 3))
    plans = {i: chooser.randint(1, 6) if i in hang_ups else None for i in range(clients)}

    async def run_all() -> list[Outcome]:
        limits = httpx.Limits(max_connections=clients)
        async with httpx.AsyncClient(base_url=base_url, timeout=300, limits=limits) as client:
            return await asyncio.gather(
                *(stream_one(client, model, i, plans[i], max_tokens) for i in range(clients))
            )

    return asyncio.run(run_all())


def assert_load_survived(outcomes: list[Outcome], engine: Any, http: httpx.Client) -> None:
    assert [o.status for o in outcomes if o.status != 200] == []  # no 5xx, nor any other refusal
    completed = [o for o in outcomes if not o.hung_up]
    assert completed and all(o.usage is not None for o in completed)
    # nothing left running and no KV block held once the aborted streams are cleaned up
    assert wait_until(lambda: engine.stats().kv_blocks_used == 0 and engine.stats().requests_running == 0)
    for outcome in completed:
        usage = outcome.usage
        assert usage["completion_tokens"] == outcome.tokens_seen >= 1
        assert usage["prompt_tokens"] == chat_prompt_tokens(http, outcome.messages)
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_100_streaming_clients_with_a_third_hanging_up(server, engine, http, model_name):
    if not isinstance(engine, FakeEngine):
        pytest.skip("the 100-client run uses the fake engine; the embedded model has its own smaller run")
    engine.token_delay = 0.005  # slow enough that the hang-ups land mid-stream
    try:
        outcomes = run_clients(server.base_url, model_name, clients=100, max_tokens=64, seed=24)
    finally:
        engine.token_delay = 0.0
    assert_load_survived(outcomes, engine, http)
    cut_short = {r.request_id for r in engine.requests[-100:] if r.request_id in engine.closed_early}
    assert cut_short and cut_short <= engine.aborted  # every stream cut short was aborted in the engine


@pytest.mark.slow
def test_streaming_clients_on_the_embedded_model(server, engine, http, model_name):
    if isinstance(engine, FakeEngine):
        pytest.skip("the embedded model's run; the fake engine has the 100-client one")
    outcomes = run_clients(server.base_url, model_name, clients=12, max_tokens=12, seed=24)
    assert_load_survived(outcomes, engine, http)
