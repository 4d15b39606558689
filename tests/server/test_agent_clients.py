"""The request shapes IDE agents send, replayed through the live server, and the answers those clients need.

Claude Code's request (tests/server/fixtures/claude_code_request.json) follows the one Claude Code
2.1.197 sent to this server: `?beta=true`, its headers, three system blocks with cache_control, a
`system` turn inside `messages`, 24 tools, `max_tokens` 32000, `thinking`, `context_management`,
`output_config`, `metadata.user_id`. opencode's and aider's follow what opencode 1.18.33 and aider
(through litellm) send to an OpenAI-compatible provider.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from .agent_requests import aider_request, claude_code_request, opencode_request
from .conftest import running_server
from .fakes import FakeEngine
from .helpers import CLIENT_TIMEOUT, sse_events

# What Claude Code reads out of the error to retry with a smaller max_tokens
OVERFLOW_RE = re.compile(r"input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+)")


def post_claude_code(client: httpx.Client, model: str, **changes: Any) -> httpx.Response:
    path, headers, body = claude_code_request(model, **changes)
    return client.post(path, headers=headers, json=body)


def count_claude_code_tokens(client: httpx.Client, model: str) -> int:
    _, headers, body = claude_code_request(model)
    response = client.post("/v1/messages/count_tokens?beta=true", headers=headers, json=body)
    assert response.status_code == 200, response.text
    return response.json()["input_tokens"]


def test_claude_code_request_streams_a_tool_call_with_its_system_turn_in_the_system_prompt():
    engine = FakeEngine(context_length=100_000, name="paddock-local")
    with running_server(engine) as server, httpx.Client(base_url=server.base_url, timeout=CLIENT_TIMEOUT) as client:
        response = post_claude_code(client, "paddock-local")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response)
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    tool_starts = [data["content_block"] for name, data in events if name == "content_block_start"][1:]
    assert [block["name"] for block in tool_starts] == ["Agent"]  # the fake calls the first tool
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    prompt = engine.tokenizer.decode(engine.requests[-1].prompt_token_ids)
    # tools, then one system turn (the system blocks, then the system turn from `messages`), then one user turn
    assert re.findall(r"<start_of_turn>(\w+)\n", prompt) == ["system", "system", "user", "assistant"]
    system_turn = prompt.split("<start_of_turn>")[2]
    assert system_turn.index("Claude Agent SDK") < system_turn.index("Available agent types")
    assert "<system-reminder>" in prompt.split("<start_of_turn>")[3] and "say hi" in prompt


def test_claude_code_overflow_is_in_anthropics_words_and_its_retry_streams():
    engine = FakeEngine(context_length=100_000, name="paddock-local")
    with running_server(engine) as server, httpx.Client(base_url=server.base_url, timeout=CLIENT_TIMEOUT) as client:
        prompt = count_claude_code_tokens(client, "paddock-local")
        engine.context_length = prompt + 1000  # room for a reply, not for 32000 tokens of it
        refused = post_claude_code(client, "paddock-local")
        assert refused.status_code == 400
        assert refused.json() == {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": f"input length and `max_tokens` exceed context limit: {prompt} + 32000 > "
                f"{prompt + 1000}, decrease input length or `max_tokens` and try again",
            },
        }
        given, _, limit = map(int, OVERFLOW_RE.search(refused.json()["error"]["message"]).groups())
        retried = post_claude_code(client, "paddock-local", max_tokens=limit - given)
    assert retried.status_code == 200
    assert [name for name, _ in sse_events(retried)][-1] == "message_stop"


def test_claude_code_request_longer_than_the_context_is_prompt_too_long(server, engine, model_name):
    with httpx.Client(base_url=server.base_url, timeout=CLIENT_TIMEOUT) as client:
        prompt = count_claude_code_tokens(client, model_name)
        context = engine.model.context_length
        assert prompt > context  # the premise: 24 tools and the system prompt alone overflow this model
        response = post_claude_code(client, model_name)
    assert response.status_code == 400
    assert response.json()["error"] == {
        "type": "invalid_request_error",
        "message": f"prompt is too long: {prompt} tokens > {context} maximum",
    }


def test_anthropic_models_listing_for_claude_code(http, model_name, engine):
    headers = {"anthropic-version": "2023-06-01", "x-api-key": "unused"}
    listing = http.get("/v1/models", headers=headers).json()
    assert listing["has_more"] is False and listing["first_id"] == listing["data"][0]["id"] == model_name
    assert listing["last_id"] == listing["data"][-1]["id"]
    model = listing["data"][0]
    assert model["type"] == "model" and model["display_name"] == model_name
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", model["created_at"])
    assert model["max_input_tokens"] == engine.model.context_length
    assert http.get(f"/v1/models/{model_name}", headers=headers).json() == model
    missing = http.get("/v1/models/claude-nothing", headers=headers)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"


def test_model_metadata_that_aider_and_litellm_read(http, model_name, engine):
    context = engine.model.context_length
    listed = next(m for m in http.get("/v1/models").json()["data"] if m["id"] == model_name)
    assert listed["object"] == "model"
    for key in ("max_model_len", "context_length", "context_window", "max_input_tokens", "max_output_tokens"):
        assert listed[key] == context, key
    assert http.get(f"/v1/models/{model_name}").json() == listed


def test_root_answers_get_and_head(http, model_name):
    got = http.get("/")
    assert got.status_code == 200
    assert got.json() == {"name": "Paddock Studio", "version": "0.1.0", "model": model_name}
    head = http.head("/")
    assert head.status_code == 200 and head.content == b""


# ---- OpenAI-protocol agents ------------------------------------------------------------------

OPENCODE_HEADERS = {"user-agent": "opencode/1.18.33 ai-sdk/provider-utils/4.0.23 runtime/bun/1.3.14"}
AIDER_HEADERS = {"user-agent": "litellm/1.80.0"}


def chat_stream(response: httpx.Response) -> tuple[str, list[dict[str, Any]], list[Any]]:
    """(text, tool-call deltas, every parsed frame) of an OpenAI chat stream."""
    frames = [data for _, data in sse_events(response)]
    assert frames[-1] == "[DONE]"
    chunks = frames[:-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    text = "".join(d.get("content") or "" for d in deltas)
    calls = [call for d in deltas for call in d.get("tool_calls") or []]
    return text, calls, chunks


@pytest.fixture(scope="module")
def agent_server(engine):
    """aider sends no max_tokens: the server's default bounds a real model's reply. The fake gets a
    32k context, as its one token per character would not hold opencode's tools in 2048."""
    target = FakeEngine(context_length=32768) if isinstance(engine, FakeEngine) else engine
    with running_server(target, default_max_tokens=16) as handle:
        yield handle


def test_opencode_request_streams_with_usage(agent_server, model_name, engine):
    body = opencode_request(model_name)
    if not isinstance(engine, FakeEngine):
        body["max_tokens"] = 8  # a real model on the CPU: a few tokens show the stream's shape
    with httpx.Client(base_url=agent_server.base_url, timeout=CLIENT_TIMEOUT) as client:
        response = client.post("/v1/chat/completions", headers=OPENCODE_HEADERS, json=body)
    assert response.status_code == 200
    text, calls, chunks = chat_stream(response)
    finish = [
        c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]
    ]
    assert len(finish) == 1 and finish[0] in ("stop", "length", "tool_calls")
    assert chunks[-1]["usage"]["completion_tokens"] >= 1 and chunks[-1]["choices"] == []
    if isinstance(engine, FakeEngine):  # the scripted answer: text, then a call of the first tool
        assert text == "Let me check. " and finish == ["tool_calls"]
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
            ("bash", {"city": "Paris"})
        ]


def test_aider_request_streams(agent_server, model_name, engine):
    with httpx.Client(base_url=agent_server.base_url, timeout=CLIENT_TIMEOUT) as client:
        response = client.post("/v1/chat/completions", headers=AIDER_HEADERS, json=aider_request(model_name))
    assert response.status_code == 200
    text, calls, _ = chat_stream(response)
    assert calls == [] and text
    if isinstance(engine, FakeEngine):
        assert text == "Echo: say hi"


def test_openai_agents_get_the_overflow_in_openai_words(agent_server, model_name):
    context = agent_server.engine.model.context_length
    body = {**opencode_request(model_name), "max_tokens": context}
    with httpx.Client(base_url=agent_server.base_url, timeout=CLIENT_TIMEOUT) as client:
        response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert f"maximum context length is {context} tokens" in error["message"]
