"""16 concurrent streaming clients on the real embedded model share one continuous batch."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.engine.core.async_engine import AsyncEngine

from .conftest import running_server

NEW_TOKENS = 12


@pytest.mark.slow  # 17-40 s: sixteen full streams on the embedded model
def test_sixteen_streams_on_the_real_engine_complete_with_exact_usage_in_one_batch(embedded_engine):
    engine = AsyncEngine(engine=embedded_engine)
    try:
        with running_server(engine) as server:

            async def one(client: openai.AsyncOpenAI, i: int) -> tuple[int, object]:
                stream = await client.chat.completions.create(
                    model=engine.model.name,
                    messages=[{"role": "user", "content": f"Count to {i + 3}, please."}],
                    max_tokens=NEW_TOKENS,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_body={"ignore_eos": True},
                )
                chunks, usage = 0, None
                async for chunk in stream:
                    chunks += bool(chunk.choices and chunk.choices[0].delta.content)
                    usage = chunk.usage or usage
                return chunks, usage

            async def run_all() -> list[tuple[int, object]]:
                client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0, timeout=600)
                try:
                    return await asyncio.gather(*(one(client, i) for i in range(16)))
                finally:
                    await client.close()

            results = asyncio.run(run_all())
            with httpx.Client(base_url=server.base_url) as http:
                for i, (chunks, usage) in enumerate(results):
                    prompt = http.post(
                        "/tokenize", json={"messages": [{"role": "user", "content": f"Count to {i + 3}, please."}]}
                    )
                    assert usage.prompt_tokens == prompt.json()["count"]
                    assert usage.completion_tokens == NEW_TOKENS
                    assert 0 < chunks <= NEW_TOKENS
                metrics = http.get("/metrics").text
        samples = {s.name: s.value for f in text_string_to_metric_families(metrics) for s in f.samples}
        assert samples["paddock_engine_batch_size_max"] >= 16
    finally:
        engine.close()
