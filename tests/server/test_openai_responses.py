"""/v1/responses with the openai SDK: input forms, function tools, the streaming event sequence."""

from __future__ import annotations

import json

import openai
import pytest
from openai.types.responses import Response

from .helpers import CLIENT_TIMEOUT, sse_events

pytestmark = pytest.mark.usefixtures("scripted")  # exact answers come from the fake engine (fakes.py)

TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def test_string_input_with_instructions(openai_client, http, model_name):
    response = openai_client.responses.create(model=model_name, input="Hello there", instructions="Be brief.")
    Response.model_validate(response.model_dump())
    assert response.status == "completed"
    assert response.output_text == "Echo: Hello there"
    assert response.instructions == "Be brief."
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    prompt = http.post("/tokenize", json={"messages": messages}).json()["count"]
    assert response.usage.input_tokens == prompt
    assert response.usage.output_tokens == len("Echo: Hello there") + 1
    assert response.usage.total_tokens == prompt + response.usage.output_tokens


def test_max_output_tokens_makes_it_incomplete(openai_client, model_name):
    response = openai_client.responses.create(model=model_name, input="Hello there", max_output_tokens=4)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == "Echo"


def test_function_call_round_trip_with_input_items(openai_client, model_name):
    first = openai_client.responses.create(model=model_name, input="Weather in Paris?", tools=[TOOL])
    calls = [item for item in first.output if item.type == "function_call"]
    assert [c.name for c in calls] == ["get_weather"]
    assert json.loads(calls[0].arguments) == {"city": "Paris"}
    follow_up = [
        {"role": "user", "content": "Weather in Paris?"},
        *[item.model_dump(exclude_none=True) for item in first.output],
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "rain"},
    ]
    second = openai_client.responses.create(model=model_name, input=follow_up, tools=[TOOL])
    assert second.output_text == "The tool says: rain"


def test_streaming_event_sequence_for_text(server, model_name):
    import httpx

    body = {"model": model_name, "input": "Hi", "stream": True}
    response = httpx.post(f"{server.base_url}/v1/responses", json=body, timeout=CLIENT_TIMEOUT)
    events = sse_events(response)
    names = [name for name, _ in events]
    deltas = names.count("response.output_text.delta")
    assert names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert all(data["type"] == name for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    final = Response.model_validate(events[-1][1]["response"])
    assert (
        final.output_text
        == "Echo: Hi"
        == "".join(d["delta"] for n, d in events if n == "response.output_text.delta")
    )


def test_streaming_function_call_with_the_sdk_helper(openai_client, model_name):
    with openai_client.responses.stream(model=model_name, input="Weather in Paris?", tools=[TOOL]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds
    assert kinds.index("response.function_call_arguments.done") < kinds.index("response.completed")
    call = next(item for item in final.output if item.type == "function_call")
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert final.output_text == "Let me check. "


def test_previous_response_id_is_refused(openai_client, model_name):
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.responses.create(model=model_name, input="Hi", previous_response_id="resp_123")
    assert caught.value.body["param"] == "previous_response_id"
