"""The prefix cache through Claude Code's per-request billing line, on the embedded Gemma 3 270M (CPU).

Claude Code starts every system prompt with `x-anthropic-billing-header: cc_version=<v>.<3 hex>;
cc_entrypoint=cli; cch=<5 hex>;`, which differs between requests (server/volatile_parts.py). Two
checks against a real Claude Code session (tests/fixtures/claude_code/, recorded against this
server), on one engine with room for its prompts:
- one of its requests of ~5,600 tokens, sent again with only `cch=` changed, then only the
  version's suffix, reads all of it but the last partial block from the cache; a server that keeps
  the line reads only the tokens before `cch=`;
- the session replayed request by request reads at least 95 % of each later agent turn's prompt.

Slow: the first request is a whole prefill on the CPU (5,597 tokens), the kept line two more;
the replay reads most of its first turn from the cache the first check left.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import running_server

pytestmark = pytest.mark.slow

SESSION = Path(__file__).parents[1] / "fixtures" / "claude_code" / "session.json.gz"
MODEL = "paddock-local"  # the name the session was recorded with
REPLY_TOKENS = 16
BILLING = "x-anthropic-billing-header: cc_version=2.1.197.404; cc_entrypoint=cli; cch=1f0a3;"


@pytest.fixture(scope="module")
def long_engine() -> Iterator[Any]:
    """An engine of its own: the suite's shared one holds 4,096 tokens, these prompts more."""
    from app.engine import AsyncEngine, EngineConfig

    engine = AsyncEngine(EngineConfig(model="default", device="cpu", max_model_len=16384, max_num_seqs=4))
    yield engine
    engine.close()


@contextmanager
def serving(engine: Any, **settings: Any) -> Iterator[httpx.Client]:
    with (
        running_server(engine, model_aliases=(MODEL,), **settings) as server,
        httpx.Client(base_url=server.base_url, timeout=900) as http,
    ):
        yield http


@pytest.fixture(scope="module")
def client(long_engine: Any) -> Iterator[httpx.Client]:
    with serving(long_engine) as http:
        yield http


def send(
    client: httpx.Client, path: str, headers: dict[str, str], body: dict[str, Any], max_tokens: int = 1
) -> dict[str, Any]:
    """The answer to one request (not streamed, `max_tokens` tokens at most: the prompt is what is measured)."""
    response = client.post(path, headers=headers, json={**body, "max_tokens": max_tokens, "stream": False})
    assert response.status_code == 200, response.text
    return response.json()


def prompt_tokens(usage: dict[str, Any]) -> int:
    return usage["input_tokens"] + usage["cache_read_input_tokens"]


def recorded_requests() -> list[dict[str, Any]]:
    with gzip.open(SESSION, "rt", encoding="utf-8") as file:
        session = json.load(file)
    return [r for r in session["requests"] if r["status"] == 200 and r["path"] == "/v1/messages"]


def with_billing(body: dict[str, Any], line: str) -> dict[str, Any]:
    """`body` with `line` as its first system block, where Claude Code writes its billing line."""
    assert body["system"][0]["text"].startswith("x-anthropic-billing-header:")
    return {**body, "system": [{"type": "text", "text": line}, *body["system"][1:]]}


def test_claude_code_request_with_another_billing_line_reads_the_rest_from_the_cache(
    long_engine: Any, client: httpx.Client
) -> None:
    """The session's first request of at least 5,500 tokens (a turn's first resume request, 5,602) with
    `cch=` in its billing line, as requests to Anthropic's API carry it; then with only `cch=` changed,
    only the version's suffix changed; then both again on a server that keeps the line."""
    request = next(r for r in recorded_requests() if prompt_tokens(r["usage"]) >= 5500)
    path, headers = f"{request['path']}?{request['query']}", request["headers"]
    first = send(client, path, headers, with_billing(request["body"], BILLING))["usage"]
    assert prompt_tokens(first) >= 5500  # (the recording's 5,602 had the turn memory's sampled ids in it)
    for changed in (BILLING.replace("cch=1f0a3", "cch=9c2e7"), BILLING.replace(".404;", ".7a9;")):
        again = send(client, path, headers, with_billing(request["body"], changed))["usage"]
        print(
            f"{changed!r}: {again['cache_read_input_tokens']} of {prompt_tokens(again)} prompt tokens cached"
        )
        assert prompt_tokens(again) == prompt_tokens(first)
        assert again["cache_read_input_tokens"] >= 5500, (changed, again)
    with serving(long_engine, strip_volatile_metadata=False) as keeping:  # the line stays in the prompt
        send(keeping, path, headers, with_billing(request["body"], BILLING))
        kept = send(keeping, path, headers, with_billing(request["body"], BILLING.replace("1f0a3", "9c2e7")))
    print(
        f"line kept, cch changed: {kept['usage']['cache_read_input_tokens']} of {prompt_tokens(kept['usage'])}"
    )
    assert kept["usage"]["cache_read_input_tokens"] < 100  # the cache stops where the line changes


def answered(body: dict[str, Any], answers: dict[str, str]) -> dict[str, Any]:
    """`body` with each earlier recorded answer's text replaced by the text this server answered in its
    place: what Claude Code would have sent back had it been talking to this replay."""
    messages = []
    for message in body["messages"]:
        content = message["content"]
        if message["role"] == "assistant" and isinstance(content, list):
            content = [
                {**block, "text": answers.get(block["text"], block["text"])}
                if block["type"] == "text"
                else block
                for block in content
            ]
        messages.append({**message, "content": content})
    return {**body, "messages": messages}


def answer_text(blocks: list[dict[str, Any]]) -> str:
    return "".join(block.get("text", "") for block in blocks if block["type"] == "text")


def test_recorded_claude_code_session_reads_each_later_turn_from_the_cache(client: httpx.Client) -> None:
    """Each request as Claude Code sent it, in order, the recorded answers in it replaced by this
    replay's (shorter: REPLY_TOKENS) answers. The agent's turns are the requests with its tools; the
    others are the title requests Claude Code sends beside them, each with another billing suffix
    than the last: past the line they share their system prompt, and only their ~55-token session
    text is new."""
    answers: dict[str, str] = {}
    turns: dict[bool, list[tuple[int, int]]] = {True: [], False: []}  # agent turn or not -> (cached, prompt)
    for request in recorded_requests():
        path = f"{request['path']}?{request['query']}"
        reply = send(client, path, request["headers"], answered(request["body"], answers), REPLY_TOKENS)
        if recorded := answer_text(request["answer"]):
            answers[recorded] = answer_text(reply["content"])
        usage = reply["usage"]
        turns[bool(request["body"].get("tools"))].append(
            (usage["cache_read_input_tokens"], prompt_tokens(usage))
        )
    print("cached of prompt tokens, per agent turn:", turns[True], "per title request:", turns[False])
    assert len(turns[True]) >= 3 and len(turns[False]) >= 2
    for cached, prompt in turns[True][1:]:
        assert cached >= 0.95 * prompt, turns[True]
    for cached, prompt in turns[False][1:]:
        assert cached >= 0.8 * prompt, turns[False]
