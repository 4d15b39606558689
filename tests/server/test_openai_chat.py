"""/v1/chat/completions driven by the official openai SDK against a real uvicorn server."""

from __future__ import annotations

import json

import openai
import pytest
from openai.types.chat import ChatCompletion

from .helpers import WEATHER_TOOL, chat_prompt_tokens

pytestmark = pytest.mark.usefixtures("scripted")  # exact answers come from the fake engine (fakes.py)

USER = [{"role": "user", "content": "Say something nice"}]


def test_chat_returns_the_answer_with_exact_usage(openai_client, http, model_name):
    response = openai_client.chat.completions.create(model=model_name, messages=USER)
    ChatCompletion.model_validate(response.model_dump())  # strict shape check, not the SDK's lenient parse
    choice = response.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == "Echo: Say something nice"
    assert choice.finish_reason == "stop"
    assert response.usage.prompt_tokens == chat_prompt_tokens(http, USER)
    assert response.usage.completion_tokens == len(choice.message.content) + 1  # one token per char, then EOS
    assert response.usage.total_tokens == response.usage.prompt_tokens + response.usage.completion_tokens


def test_streamed_chat_matches_the_whole_answer_and_reports_usage(openai_client, model_name):
    whole = openai_client.chat.completions.create(model=model_name, messages=USER)
    stream = openai_client.chat.completions.create(
        model=model_name, messages=USER, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finishing] == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_without_include_usage_sends_no_usage(openai_client, model_name):
    chunks = list(openai_client.chat.completions.create(model=model_name, messages=USER, stream=True))
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_max_tokens_and_max_completion_tokens_cut_the_answer(openai_client, model_name):
    for field in ("max_tokens", "max_completion_tokens"):
        response = openai_client.chat.completions.create(model=model_name, messages=USER, **{field: 4})
        assert response.choices[0].message.content == "Echo"
        assert response.choices[0].finish_reason == "length"
        assert response.usage.completion_tokens == 4


def test_stop_string_ends_the_answer_without_it(openai_client, model_name):
    response = openai_client.chat.completions.create(model=model_name, messages=USER, stop=["something"])
    assert response.choices[0].message.content == "Echo: Say "
    assert response.choices[0].finish_reason == "stop"
    assert response.choices[0].model_extra["stop_reason"] == "something"


def test_sampling_fields_reach_the_engine(openai_client, engine, model_name):
    openai_client.chat.completions.create(
        model=model_name,
        messages=USER,
        temperature=0.7,
        top_p=0.9,
        seed=1234,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        extra_body={
            "top_k": 40,
            "min_p": 0.05,
            "repetition_penalty": 1.1,
            "ignore_eos": True,
            "min_tokens": 3,
        },
        max_tokens=30,
    )
    params = engine.requests[-1].sampling_params
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.7, 0.9, 40, 0.05)
    assert (params.seed, params.presence_penalty, params.frequency_penalty) == (1234, 0.5, -0.5)
    assert (params.repetition_penalty, params.ignore_eos, params.min_tokens, params.max_tokens) == (
        1.1,
        True,
        3,
        30,
    )
    assert "<end_of_turn>" in params.stop  # the template's own turn end


def test_ignore_eos_generates_to_max_tokens(openai_client, model_name):
    response = openai_client.chat.completions.create(
        model=model_name, messages=USER, max_tokens=60, extra_body={"ignore_eos": True}
    )
    assert response.usage.completion_tokens == 60
    assert response.choices[0].finish_reason == "length"


def test_logprobs_with_top_alternatives(openai_client, model_name):
    response = openai_client.chat.completions.create(
        model=model_name, messages=USER, logprobs=True, top_logprobs=2
    )
    content = response.choices[0].logprobs.content
    assert "".join(item.token for item in content) == response.choices[0].message.content + "<eos>"
    assert all(item.logprob == -0.25 and len(item.top_logprobs) == 2 for item in content)
    assert content[0].bytes == list(content[0].token.encode())


def test_n_choices_each_get_their_own_seed(openai_client, engine, model_name):
    response = openai_client.chat.completions.create(model=model_name, messages=USER, n=2, seed=7)
    assert [c.index for c in response.choices] == [0, 1]
    assert sorted(r.sampling_params.seed for r in engine.requests[-2:]) == [7, 8]
    assert response.usage.completion_tokens == 2 * (len(response.choices[0].message.content) + 1)


def test_tool_call_round_trip(openai_client, http, model_name):
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    first = openai_client.chat.completions.create(model=model_name, messages=messages, tools=[WEATHER_TOOL])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert first.usage.prompt_tokens == chat_prompt_tokens(http, messages, [WEATHER_TOOL])

    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    second = openai_client.chat.completions.create(model=model_name, messages=messages, tools=[WEATHER_TOOL])
    assert second.choices[0].message.content == "The tool says: sunny, 21 C"
    assert second.choices[0].finish_reason == "stop"
    assert not second.choices[0].message.tool_calls


def test_streamed_tool_call_is_assembled_by_the_sdk(openai_client, model_name):
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    with openai_client.chat.completions.stream(
        model=model_name, messages=messages, tools=[WEATHER_TOOL]
    ) as stream:
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check. "  # streamed before the call marker
    assert choice.message.tool_calls[0].function.name == "get_weather"
    assert json.loads(choice.message.tool_calls[0].function.arguments) == {"city": "Paris"}


def test_tool_choice_none_renders_no_tools(openai_client, model_name):
    response = openai_client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": "hi"}],
        tools=[WEATHER_TOOL],
        tool_choice="none",
    )
    assert response.choices[0].message.content == "Echo: hi"


def test_tool_choice_naming_an_unknown_tool_is_rejected(openai_client, model_name):
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.chat.completions.create(
            model=model_name,
            messages=USER,
            tools=[WEATHER_TOOL],
            tool_choice={"type": "function", "function": {"name": "launch_rocket"}},
        )
    assert "launch_rocket" in caught.value.body["message"]


def test_json_object_mode_is_instructed_and_checked(openai_client, model_name):
    response = openai_client.chat.completions.create(
        model=model_name, messages=USER, response_format={"type": "json_object"}
    )
    assert json.loads(response.choices[0].message.content) == {"answer": 42}
    assert "json_error" not in response.choices[0].model_extra


def test_json_schema_mismatch_is_flagged(openai_client, model_name):
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    response = openai_client.chat.completions.create(
        model=model_name,
        messages=USER,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}},
    )
    assert response.choices[0].model_extra["json_error"] == "$ is missing name"


def test_image_content_is_refused_clearly(openai_client, model_name):
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.chat.completions.create(
            model=model_name,
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}],
        )
    assert caught.value.body["param"] == "messages[0].content[0]"
