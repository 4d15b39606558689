"""Claude Code's billing line is kept out of the prompt (server/volatile_parts.py), unless switched off.

Fast: the scripted fake engine, whose tokenizer decodes the prompt ids back to the text the template
rendered. The embedded model's cached-token figures are in test_volatile_cache.py (slow).
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

import httpx
import pytest

from app.engine.server.volatile_parts import strip_volatile

from .agent_requests import claude_code_request
from .conftest import running_server
from .fakes import FakeEngine

BILLING = "x-anthropic-billing-header: cc_version=2.1.197.404; cc_entrypoint=cli; cch=1f0a3;"
MODEL = "paddock-local"


def test_the_billing_line_goes_and_everything_else_stays() -> None:
    messages = [
        {"role": "system", "content": f"{BILLING}\nYou are Claude Code.\n\n  indented\ttext \n"},
        {"role": "user", "content": f"{BILLING}\nquoted by the user"},
        {"role": "system", "content": f"Mid-conversation note.\n{BILLING}\nafter it"},
    ]
    before = [dict(m) for m in messages]
    stripped = strip_volatile(messages)
    assert stripped.messages == [
        {"role": "system", "content": "You are Claude Code.\n\n  indented\ttext \n"},
        {"role": "user", "content": f"{BILLING}\nquoted by the user"},  # only system content is metadata
        {"role": "system", "content": "Mid-conversation note.\nafter it"},
    ]
    assert stripped.removed == (BILLING, BILLING)
    assert messages == before  # the caller's messages are not changed


def test_a_system_message_of_the_billing_line_alone_is_dropped_and_a_prompt_without_one_is_the_same() -> None:
    assert strip_volatile(
        [{"role": "system", "content": BILLING}, {"role": "user", "content": "hi"}]
    ).messages == [{"role": "user", "content": "hi"}]
    plain = [{"role": "system", "content": "x-anthropic-billing-header is a name, not a header line here"}]
    stripped = strip_volatile(plain)
    assert stripped.messages == plain and stripped.removed == ()
    assert strip_volatile([{"role": "system", "content": f" {BILLING}"}]).removed == ()  # whole lines only


def prompt_text(engine: FakeEngine) -> str:
    return engine.tokenizer.decode(engine.requests[-1].prompt_token_ids)


def post_claude_code(client: httpx.Client, billing: str) -> httpx.Response:
    path, headers, body = claude_code_request(MODEL, max_tokens=64, stream=False)
    system = [{"type": "text", "text": billing}, *body["system"][1:]]
    return client.post(path, headers=headers, json={**body, "system": system})


def test_claude_code_requests_that_differ_in_the_billing_line_send_the_same_prompt(caplog: Any) -> None:
    engine = FakeEngine(context_length=100_000, name=MODEL)
    lines = [BILLING, BILLING.replace("cch=1f0a3", "cch=9c2e7"), BILLING.replace("404", "7a9")]
    prompts = []
    with (
        running_server(engine) as server,
        httpx.Client(base_url=server.base_url, timeout=30) as client,
        caplog.at_level(logging.DEBUG, logger="app.engine.server.prompting"),
    ):
        for line in lines:
            assert post_claude_code(client, line).status_code == 200
            prompts.append(list(engine.requests[-1].prompt_token_ids))
        _, headers, body = claude_code_request(MODEL)  # its own billing line, cc_entrypoint=sdk-cli
        counted = client.post("/v1/messages/count_tokens", headers=headers, json=body).json()["input_tokens"]
    assert prompts[0] == prompts[1] == prompts[2] and counted == len(prompts[0])
    text = prompt_text(engine)
    assert "x-anthropic-billing-header" not in text
    assert text.index("You are a Claude agent") < text.index("Use the instructions below")
    records = [r for r in caplog.records if "x-anthropic-billing-header" in r.getMessage()]
    assert [r.levelno for r in records] == [logging.INFO] + [logging.DEBUG] * 3  # count_tokens too
    assert "cch=9c2e7" in records[1].getMessage() and "--keep-volatile-metadata" in records[0].getMessage()


def test_openai_chat_system_and_developer_messages_lose_the_line_too() -> None:
    engine = FakeEngine(context_length=100_000, name=MODEL)
    messages = [
        {"role": "developer", "content": f"{BILLING}\nBe brief."},
        {"role": "user", "content": "hi"},
    ]
    with running_server(engine) as server, httpx.Client(base_url=server.base_url, timeout=30) as client:
        response = client.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 8}
        )
    assert response.status_code == 200, response.text
    assert "x-anthropic-billing-header" not in prompt_text(engine) and "Be brief." in prompt_text(engine)


def test_switched_off_the_prompt_keeps_the_line_as_sent() -> None:
    engine = FakeEngine(context_length=100_000, name=MODEL)
    with (
        running_server(engine, strip_volatile_metadata=False) as server,
        httpx.Client(base_url=server.base_url, timeout=30) as client,
    ):
        assert post_claude_code(client, BILLING).status_code == 200
        first = list(engine.requests[-1].prompt_token_ids)
        assert post_claude_code(client, BILLING.replace("1f0a3", "9c2e7")).status_code == 200
    assert BILLING.replace("1f0a3", "9c2e7") in prompt_text(engine)
    assert first != list(engine.requests[-1].prompt_token_ids)


@pytest.mark.parametrize(("argv", "expected"), [([], True), (["--keep-volatile-metadata"], False)])
def test_serve_flag_sets_the_switch(argv: list[str], expected: bool) -> None:
    from app.commands import serve

    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    assert serve.server_settings(parser.parse_args(argv)).strip_volatile_metadata is expected
