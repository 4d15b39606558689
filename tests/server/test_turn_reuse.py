"""Multi-turn chat on the embedded Gemma 3 270M: turn 2 re-sends turn 1's messages, the reply verbatim
and a new user message, and reads from the prefix cache everything up to the end of the reply.

Turn 1 leaves `prompt + output - 1` tokens with KV (the last sampled token is never run); the
cache keeps their full blocks, so turn 2 can read `(prompt + output - 1) // block * block` of them.
Sampled text often re-tokenizes into other ids ("▁post" "paid" -> "▁postpaid"): without the turn
memory (server/turn_memory.py) turn 2 hits only turn 1's prompt blocks, which the first test shows.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import anthropic
import httpx
import openai
import pytest

from app.commands.bench_load import Plan, run_session

from .conftest import running_server
from .fakes import FakeEngine
from .helpers import CLIENT_TIMEOUT

# 90 s on two cores: a dozen requests on the embedded model
pytestmark = pytest.mark.slow

TOOLS = [
    {"type": "function", "function": {"name": "read_file", "description": "Read a file of the project",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
]  # fmt: skip


@pytest.fixture(autouse=True)
def real_engine(engine: Any) -> None:
    if isinstance(engine, FakeEngine):
        pytest.skip("the scripted fake has no prefix cache")


@pytest.fixture
def block(embedded_engine: Any) -> int:
    return embedded_engine.config.block_size


def reusable(prompt_tokens: int, output_tokens: int, block: int) -> int:
    """Turn 1's tokens whose KV the cache holds in full blocks (the last sampled token has none)."""
    return (prompt_tokens + output_tokens - 1) // block * block


def system(name: str) -> dict[str, str]:
    # each test its own system prompt: nothing another test cached can match
    return {"role": "system", "content": f"You are a coding agent ({name}). Answer briefly."}


def two_turns(client: openai.OpenAI, model: str, name: str, **sampling: Any) -> tuple[Any, Any]:
    messages = [system(name), {"role": "user", "content": "Describe the weather in three lines."}]
    first = client.chat.completions.create(model=model, messages=messages, max_tokens=40, **sampling)
    again = [
        *messages,
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Now say it shorter."},
    ]
    second = client.chat.completions.create(model=model, messages=again, max_tokens=4, temperature=0)
    return first, second


# Temperature 2 samples strings of rare pieces that the tokenizer spells otherwise; the seed fixes them
SAMPLED = {"temperature": 2.0, "seed": 7, "extra_body": {"ignore_eos": True}}


def test_without_the_memory_turn_two_misses_the_sampled_reply(
    engine: Any, model_name: str, block: int
) -> None:
    with running_server(engine, remembered_turns=0) as handle:
        client = openai.OpenAI(base_url=f"{handle.base_url}/v1", api_key="none", max_retries=0, timeout=CLIENT_TIMEOUT)
        first, second = two_turns(client, model_name, "no memory", **SAMPLED)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached < reusable(first.usage.prompt_tokens, first.usage.completion_tokens, block)
    assert cached >= first.usage.prompt_tokens // block * block - block  # turn 1's prompt still hits


@pytest.mark.parametrize("sampling", [SAMPLED, {"temperature": 0}], ids=["sampled", "greedy"])
def test_openai_turn_two_reads_the_whole_reply_from_the_cache(
    openai_client: openai.OpenAI, model_name: str, block: int, sampling: dict[str, Any]
) -> None:
    first, second = two_turns(openai_client, model_name, f"openai {sampling['temperature']}", **sampling)
    expected = reusable(first.usage.prompt_tokens, first.usage.completion_tokens, block)
    assert second.usage.prompt_tokens_details.cached_tokens == expected
    assert expected >= first.usage.prompt_tokens + first.usage.completion_tokens - block


def test_anthropic_turn_two_reads_the_whole_reply_from_the_cache(
    anthropic_client: anthropic.Anthropic, model_name: str, block: int
) -> None:
    prompt = system("anthropic")["content"]
    messages: list[Any] = [{"role": "user", "content": "Describe the weather in three lines."}]
    first = anthropic_client.messages.create(
        model=model_name, system=prompt, messages=messages, max_tokens=40, extra_body={"temperature": 0}
    )
    reply = "".join(block.text for block in first.content if block.type == "text")
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Shorter."}]
    second = anthropic_client.messages.create(
        model=model_name, system=prompt, messages=messages, max_tokens=4, extra_body={"temperature": 0}
    )
    prompt_tokens = first.usage.input_tokens + first.usage.cache_read_input_tokens
    expected = reusable(prompt_tokens, first.usage.output_tokens, block)
    assert second.usage.cache_read_input_tokens == expected


def test_tool_call_and_result_turn_reads_the_call_from_the_cache(
    openai_client: openai.OpenAI, model_name: str, block: int
) -> None:
    messages: list[Any] = [system("tools"), {"role": "user", "content": "What does README.md say?"}]
    # "required" on both turns: the system turn's tool instruction must not change between them
    ask = {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False, "temperature": 0}
    first = openai_client.chat.completions.create(model=model_name, messages=messages, max_tokens=60, **ask)
    call = first.choices[0].message.tool_calls[0]
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "# Paddock\nA local LLM studio."},
    ]
    second = openai_client.chat.completions.create(model=model_name, messages=messages, max_tokens=4, **ask)
    expected = reusable(first.usage.prompt_tokens, first.usage.completion_tokens, block)
    assert first.choices[0].finish_reason == "tool_calls"
    assert second.usage.prompt_tokens_details.cached_tokens == expected


def test_agent_sessions_read_every_earlier_turn_from_the_cache(
    server: Any, model_name: str, block: int
) -> None:
    """The benchmark's multi-turn load (`paddock bench --turns`): two sessions of four streamed turns
    at once, sampled, ignore_eos; turn k reads turn k-1's prompt and answer from the cache."""
    plan = Plan(model=model_name, output_tokens=24, prefix=system("agent")["content"], turns=4)
    rng = random.Random(3)
    texts = [[" ".join(rng.choice(["river", "engine", "paper", "window"]) for _ in range(12)) for _ in range(4)]
             for _ in range(2)]  # fmt: skip

    async def sessions() -> list[Any]:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=CLIENT_TIMEOUT) as client:
            done = await asyncio.gather(*(run_session(client, plan, i, t) for i, t in enumerate(texts)))
        return [turn for session in done for turn in session]

    turns = asyncio.run(sessions())
    by_key = {(t.session, t.turn): t for t in turns}
    for (session, turn), result in by_key.items():
        if turn == 1:
            continue
        before = by_key[(session, turn - 1)]
        assert result.cached_tokens == reusable(before.prompt_tokens, before.output_tokens, block), (
            session,
            turn,
        )
