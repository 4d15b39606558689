"""/v1/messages and /v1/messages/count_tokens driven by the official anthropic SDK."""

from __future__ import annotations

import anthropic
import httpx
import pytest
from anthropic.types import Message

from .helpers import CLIENT_TIMEOUT, sse_events

pytestmark = pytest.mark.usefixtures("scripted")  # exact answers come from the fake engine (fakes.py)

TOOL = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def test_message_with_system_and_exact_usage(anthropic_client, model_name):
    kwargs = {"model": model_name, "system": "Be kind.", "messages": [{"role": "user", "content": "Hello"}]}
    message = anthropic_client.messages.create(max_tokens=100, **kwargs)
    Message.model_validate(message.model_dump())
    assert message.content[0].type == "text" and message.content[0].text == "Echo: Hello"
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.usage.input_tokens == anthropic_client.messages.count_tokens(**kwargs).input_tokens
    assert message.usage.output_tokens == len("Echo: Hello") + 1


def test_multi_turn_answers_the_last_turn(anthropic_client, model_name):
    turns = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": [{"type": "text", "text": "Echo: first"}]},
        {"role": "user", "content": [{"type": "text", "text": "second"}]},
    ]
    message = anthropic_client.messages.create(model=model_name, max_tokens=100, messages=turns)
    assert message.content[0].text == "Echo: second"


def test_max_tokens_and_stop_sequences(anthropic_client, model_name):
    turn = [{"role": "user", "content": "Hello world"}]
    short = anthropic_client.messages.create(model=model_name, max_tokens=3, messages=turn)
    assert (short.stop_reason, short.content[0].text) == ("max_tokens", "Ech")
    stopped = anthropic_client.messages.create(
        model=model_name, max_tokens=100, messages=turn, stop_sequences=["world"]
    )
    assert (stopped.stop_reason, stopped.stop_sequence, stopped.content[0].text) == (
        "stop_sequence",
        "world",
        "Echo: Hello ",
    )


def test_stream_has_the_exact_event_sequence(server, model_name):
    body = {
        "model": model_name,
        "max_tokens": 100,
        "stream": True,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    response = httpx.post(f"{server.base_url}/v1/messages", json=body, timeout=CLIENT_TIMEOUT)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response)
    names = [name for name, _ in events]
    deltas = names.count("content_block_delta")
    assert names == [
        "message_start",
        "content_block_start",
        "ping",
        *["content_block_delta"] * deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(data["type"] == name for name, data in events)
    text = "".join(data["delta"]["text"] for name, data in events if name == "content_block_delta")
    assert text == "Echo: Hi"
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"
    assert events[-2][1]["usage"]["output_tokens"] == len(text) + 1


def test_stream_with_the_sdk_helper(anthropic_client, model_name):
    with anthropic_client.messages.stream(
        model=model_name, max_tokens=100, messages=[{"role": "user", "content": "Hi"}]
    ) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == final.content[0].text == "Echo: Hi"
    assert final.usage.output_tokens == len("Echo: Hi") + 1


def test_tool_use_round_trip(anthropic_client, model_name):
    turns = [{"role": "user", "content": "Weather in Paris?"}]
    first = anthropic_client.messages.create(model=model_name, max_tokens=200, messages=turns, tools=[TOOL])
    assert first.stop_reason == "tool_use"
    tool_use = next(block for block in first.content if block.type == "tool_use")
    assert (tool_use.name, tool_use.input) == ("get_weather", {"city": "Paris"})
    turns += [
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "snow"}]},
    ]
    second = anthropic_client.messages.create(model=model_name, max_tokens=200, messages=turns, tools=[TOOL])
    assert second.stop_reason == "end_turn"
    assert second.content[0].text == "The tool says: snow"


def test_streamed_tool_use_is_assembled_by_the_sdk(anthropic_client, model_name):
    with anthropic_client.messages.stream(
        model=model_name, max_tokens=200, messages=[{"role": "user", "content": "Weather?"}], tools=[TOOL]
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    tool_use = next(block for block in final.content if block.type == "tool_use")
    assert tool_use.input == {"city": "Paris"}


def test_count_tokens_counts_tools_too(anthropic_client, model_name):
    turns = [{"role": "user", "content": "Weather?"}]
    plain = anthropic_client.messages.count_tokens(model=model_name, messages=turns).input_tokens
    with_tools = anthropic_client.messages.count_tokens(
        model=model_name, messages=turns, tools=[TOOL]
    ).input_tokens
    assert with_tools > plain > 0


def test_images_are_refused_in_anthropic_shape(anthropic_client, model_name):
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    with pytest.raises(anthropic.BadRequestError) as caught:
        anthropic_client.messages.create(
            model=model_name, max_tokens=10, messages=[{"role": "user", "content": [image]}]
        )
    assert caught.value.body["type"] == "error"
    assert caught.value.body["error"]["type"] == "invalid_request_error"


def test_system_turns_inside_messages_join_the_system_prompt_in_order(anthropic_client, engine, model_name):
    turns = [
        {"role": "user", "content": "first"},
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": [{"type": "text", "text": "second"}]},
    ]
    message = anthropic_client.messages.create(
        model=model_name, max_tokens=100, system="Be kind.", messages=turns
    )
    assert message.content[0].text == "Echo: first\n\nsecond"  # the user turns around it became one
    prompt = engine.tokenizer.decode(engine.requests[-1].prompt_token_ids)
    assert (
        "<start_of_turn>system\nBe kind.\n\nBe terse.<end_of_turn>\n<start_of_turn>user\nfirst\n\nsecond"
        in prompt
    )


def test_a_system_turn_holds_text_only(http, model_name):
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
    body = {
        "model": model_name,
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": [image]}],
    }
    response = http.post("/v1/messages", json=body)
    assert response.status_code == 400
    assert response.json()["error"] == {
        "type": "invalid_request_error",
        "message": "A system turn may hold text blocks only.",
    }
