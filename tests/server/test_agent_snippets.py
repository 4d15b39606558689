"""The Server pane's snippets are the settings that work: each agent's snippet is read back and drives the server.

The server requires an API key here, so a snippet that puts the key in the wrong place fails.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import httpx
import pytest
import yaml

from app.engine.server.launch import ServerHandle
from app.studio.server_control import Endpoints, Snippet, agent_snippets

from .agent_requests import aider_request, claude_code_request, opencode_request
from .conftest import running_server
from .fakes import FakeEngine
from .helpers import CLIENT_TIMEOUT, sse_events

KEY = "sk-snippet-test"


@pytest.fixture(scope="module")
def keyed() -> Iterator[tuple[ServerHandle, dict[str, Snippet]]]:
    engine = FakeEngine(context_length=100_000)
    with running_server(engine, api_key=KEY) as server:
        endpoints = Endpoints(server.base_url, None)
        snippets = agent_snippets(endpoints, engine.model.name, KEY, engine.model.context_length)
        yield server, {snippet.key: snippet for snippet in snippets}


def exports(text: str) -> dict[str, str]:
    return dict(re.findall(r"^export (\w+)=(\S+)$", text, re.MULTILINE))


def test_claude_code_snippet(keyed):
    _, snippets = keyed
    env = exports(snippets["claude-code"].text)
    path, headers, body = claude_code_request(env["ANTHROPIC_MODEL"])
    # Claude Code sends ANTHROPIC_AUTH_TOKEN as a bearer token (the recorded request has a placeholder)
    headers = {**headers, "authorization": f"Bearer {env['ANTHROPIC_AUTH_TOKEN']}"}
    with httpx.Client(base_url=env["ANTHROPIC_BASE_URL"], timeout=CLIENT_TIMEOUT) as client:
        response = client.post(path, headers=headers, json=body)
    assert response.status_code == 200 and sse_events(response)[-1][0] == "message_stop"
    for tier in ("OPUS", "SONNET", "HAIKU"):
        assert env[f"ANTHROPIC_DEFAULT_{tier}_MODEL"] == env["ANTHROPIC_MODEL"]


def test_aider_snippet(keyed):
    _, snippets = keyed
    flags = dict(re.findall(r"--([\w-]+) (\S+)", snippets["aider"].text))
    provider, model = flags["model"].split("/", 1)
    assert provider == "openai"  # litellm: an OpenAI-compatible server, the prefix stripped from requests
    with httpx.Client(base_url=flags["openai-api-base"], timeout=CLIENT_TIMEOUT) as client:
        response = client.post(
            "/chat/completions",
            headers={"authorization": f"Bearer {flags['openai-api-key']}"},
            json=aider_request(model),
        )
    assert response.status_code == 200 and sse_events(response)[-1][1] == "[DONE]"


def test_opencode_snippet(keyed):
    _, snippets = keyed
    config = json.loads(snippets["opencode"].text)
    provider_id, model = config["model"].split("/", 1)
    provider = config["provider"][provider_id]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    limit = provider["models"][model]["limit"]
    body = {**opencode_request(model), "max_tokens": limit["output"]}  # what opencode sends each turn
    with httpx.Client(base_url=provider["options"]["baseURL"], timeout=CLIENT_TIMEOUT) as client:
        response = client.post(
            "/chat/completions",
            headers={"authorization": f"Bearer {provider['options']['apiKey']}"},
            json=body,
        )
    assert response.status_code == 200 and sse_events(response)[-1][1] == "[DONE]"
    assert limit["context"] == 100_000 and limit["output"] < limit["context"]


def test_continue_snippet(keyed):
    _, snippets = keyed
    (model,) = yaml.safe_load(snippets["continue"].text)["models"]
    assert model["provider"] == "openai"
    with httpx.Client(base_url=model["apiBase"], timeout=CLIENT_TIMEOUT) as client:
        response = client.post(
            "/chat/completions",
            headers={"authorization": f"Bearer {model['apiKey']}"},
            json={"model": model["model"], "messages": [{"role": "user", "content": "hi"}], "stream": True},
        )
    assert response.status_code == 200 and sse_events(response)[-1][1] == "[DONE]"


def test_a_wrong_key_is_refused_so_the_snippets_key_is_what_counts(keyed):
    server, _ = keyed
    response = httpx.post(
        f"{server.base_url}/v1/chat/completions",
        headers={"authorization": "Bearer wrong"},
        json={"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert response.status_code == 401
