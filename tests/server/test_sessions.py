"""Session identity for fairness: the API key, the body's user, else the connection (sessions.py)."""

from __future__ import annotations

import httpx

from .conftest import running_server
from .fakes import FakeEngine

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
MESSAGES = {"model": "fake-model", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


def test_sessions_come_from_key_user_or_connection() -> None:
    engine = FakeEngine()
    with running_server(engine) as handle:
        base = handle.base_url
        with httpx.Client(base_url=base) as one, httpx.Client(base_url=base) as two:
            one.post("/v1/chat/completions", json=CHAT).raise_for_status()
            one.post("/v1/chat/completions", json=CHAT).raise_for_status()  # the same keep-alive connection
            two.post("/v1/chat/completions", json=CHAT).raise_for_status()
            one.post("/v1/chat/completions", json={**CHAT, "user": "alice"}).raise_for_status()
            one.post("/v1/messages", json={**MESSAGES, "metadata": {"user_id": "alice"}}).raise_for_status()
            one.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer k1"}).raise_for_status()
            two.post("/v1/messages", json=MESSAGES, headers={"x-api-key": "k1"}).raise_for_status()
            two.post("/v1/chat/completions", json={**CHAT, "user": "bob"},
                     headers={"Authorization": "Bearer k1"}).raise_for_status()  # fmt: skip
    first, again, other, alice, alice_anthropic, key, key_anthropic, key_bob = (
        r.session_id for r in engine.requests
    )
    assert first == again and first.startswith("conn:127.0.0.1:") and other != first
    assert alice == alice_anthropic == "user:alice"  # OpenAI user and Anthropic metadata.user_id alike
    assert key == key_anthropic and key.startswith("key:") and "k1" not in key  # the key is hashed
    assert key_bob == f"{key}|user:bob"
