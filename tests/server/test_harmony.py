"""A GPT-OSS reply in the harmony format streamed through both APIs, on a scripted token sequence.

The engine here is the fake (fakes.py) with a harmony vocabulary: its special tokens are single
tokens whose text is dropped when a request asks for `skip_special_tokens`, as a real tokenizer
does, and the chat template is the engine's own harmony renderer. The scripted replies are what
GPT-OSS writes: reasoning on the analysis channel, then a tool call on commentary addressed to
`functions.get_weather`, or (after the tool's result) a final answer; each ends on the token the
engine stops at (`<|call|>`, `<|return|>`), which is not printed, as an end-of-sequence token is
not. The OpenAI client must see the reasoning as `reasoning_content` and the call as a tool call;
the Anthropic client a thinking block, then the text or tool_use block.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from app.engine.text.harmony_render import HarmonyTemplate

from .conftest import running_server
from .fakes import MarkupTokenizer, ToolTurnEngine
from .helpers import CLIENT_TIMEOUT, sse_events
from .helpers import WEATHER_TOOL as TOOL

SPECIALS = ["<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>",
            "<|return|>", "<|call|>"]  # fmt: skip
THINK_CALL = "The user wants the weather in Paris. I should call get_weather."
THINK_ANSWER = "The tool said 21 C; answer briefly."
ANSWER = "It is 21 C in Paris."
CALL_REPLY = (
    f"<|channel|>analysis<|message|>{THINK_CALL}<|end|>"
    '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>'
)
ANSWER_REPLY = f"<|channel|>analysis<|message|>{THINK_ANSWER}<|end|><|start|>assistant<|channel|>final<|message|>{ANSWER}<|return|>"


@pytest.fixture(scope="module")
def engine() -> ToolTurnEngine:
    return ToolTurnEngine(
        tokenizer=MarkupTokenizer(SPECIALS, ("<|return|>", "<|call|>")), chat_template=HarmonyTemplate(),  # type: ignore[arg-type]
        call_reply=CALL_REPLY, answer_reply=ANSWER_REPLY, tools_mark="namespace functions",
        user_mark="<|start|>user", result_mark="to=assistant<|channel|>",
    )  # fmt: skip


@pytest.fixture(scope="module")
def server(engine: ToolTurnEngine) -> Iterator:
    with running_server(engine) as handle:
        yield handle


def test_prompt_is_harmony_and_asks_for_special_tokens(openai_client, engine):
    openai_client.chat.completions.create(
        model=engine.name, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[TOOL]
    )
    request = engine.requests[-1]
    prompt = engine.tokenizer.decode(request.prompt_token_ids)
    assert prompt.startswith("<|start|>system<|message|>")
    assert "type get_weather = (_: {\ncity: string,\n}) => any;" in prompt
    assert prompt.endswith("<|start|>user<|message|>Weather in Paris?<|end|><|start|>assistant")
    assert request.sampling_params.skip_special_tokens is False


def test_openai_stream_separates_reasoning_and_parses_the_call(openai_client, engine):
    stream = openai_client.chat.completions.create(
        model=engine.name,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[TOOL],
        stream=True,
    )
    reasoning, content, calls, finish = "", "", [], None
    for chunk in stream:
        delta = chunk.choices[0].delta
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        content += delta.content or ""
        calls += delta.tool_calls or []
        finish = chunk.choices[0].finish_reason or finish
    assert reasoning == THINK_CALL
    assert content == ""
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert finish == "tool_calls"


def test_openai_tool_round_trip_ends_in_the_final_answer(openai_client, engine):
    turns = [{"role": "user", "content": "Weather in Paris?"}]
    first = openai_client.chat.completions.create(model=engine.name, messages=turns, tools=[TOOL])
    message = first.choices[0].message
    assert message.model_extra["reasoning_content"] == THINK_CALL
    (call,) = message.tool_calls
    turns += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "21 C"},
    ]
    stream = openai_client.chat.completions.create(
        model=engine.name, messages=turns, tools=[TOOL], stream=True
    )
    pieces = [(k, v) for chunk in stream for k, v in chunk.choices[0].delta.model_dump().items()
              if k in ("content", "reasoning_content") and v]  # fmt: skip
    assert "".join(v for k, v in pieces if k == "reasoning_content") == THINK_ANSWER
    assert "".join(v for k, v in pieces if k == "content") == ANSWER
    assert [k for k, _ in pieces].index("content") > max(
        i for i, (k, _) in enumerate(pieces) if k != "content"
    )
    prompt = engine.tokenizer.decode(engine.requests[-1].prompt_token_ids)
    assert (
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>'
        in prompt
    )
    assert prompt.endswith(
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>21 C<|end|><|start|>assistant"
    )


def test_anthropic_stream_has_a_thinking_block_then_the_tool_use(server, anthropic_client, engine):
    body = {"model": engine.name, "max_tokens": 300, "stream": True, "tools": [_anthropic_tool()],
            "messages": [{"role": "user", "content": "Weather in Paris?"}]}  # fmt: skip
    events = sse_events(httpx.post(f"{server.base_url}/v1/messages", json=body, timeout=CLIENT_TIMEOUT))
    starts = [data["content_block"]["type"] for name, data in events if name == "content_block_start"]
    assert starts == ["thinking", "tool_use"]  # nothing was said to the user: no text block
    thinking = "".join(d["delta"].get("thinking", "") for n, d in events if n == "content_block_delta")
    assert thinking == THINK_CALL
    with anthropic_client.messages.stream(model=engine.name, max_tokens=300, tools=[_anthropic_tool()],
                                          messages=[{"role": "user", "content": "Weather in Paris?"}]) as stream:  # fmt: skip
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert final.content[0].type == "thinking" and final.content[0].thinking == THINK_CALL
    tool_use = next(block for block in final.content if block.type == "tool_use")
    assert (tool_use.name, tool_use.input) == ("get_weather", {"city": "Paris"})


def test_anthropic_answer_after_the_tool_result(anthropic_client, engine):
    turns = [{"role": "user", "content": "Weather in Paris?"}]
    first = anthropic_client.messages.create(
        model=engine.name, max_tokens=300, messages=turns, tools=[_anthropic_tool()]
    )
    tool_use = next(block for block in first.content if block.type == "tool_use")
    turns += [
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "21 C"}]},
    ]
    with anthropic_client.messages.stream(
        model=engine.name, max_tokens=300, messages=turns, tools=[_anthropic_tool()]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == ANSWER
    assert [block.type for block in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == THINK_ANSWER
    assert final.stop_reason == "end_turn"


def _anthropic_tool() -> dict:
    function = TOOL["function"]
    return {
        "name": function["name"],
        "description": function["description"],
        "input_schema": function["parameters"],
    }


def test_responses_api_gives_the_reasoning_as_its_own_item(openai_client, engine):
    reply = openai_client.responses.create(model=engine.name, input="What is it like?")
    assert [item.type for item in reply.output] == ["reasoning", "message"]
    reasoning = reply.output[0]
    assert [part.text for part in reasoning.content] == [THINK_ANSWER]
    assert reasoning.summary == [] and reasoning.status == "completed"
    assert reply.output_text == ANSWER  # the reasoning is not part of the answer
    tool = {"type": "function", **{k: TOOL["function"][k] for k in ("name", "description", "parameters")}}
    called = openai_client.responses.create(model=engine.name, input="Weather in Paris?", tools=[tool])
    assert [item.type for item in called.output] == ["reasoning", "function_call"]
    assert called.output[0].content[0].text == THINK_CALL
    call = called.output[1]
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})


def test_responses_stream_has_reasoning_events_before_the_answer(openai_client, engine):
    with openai_client.responses.stream(model=engine.name, input="What is it like?") as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    deltas = kinds.count("response.reasoning_text.delta")
    texts = kinds.count("response.output_text.delta")
    assert deltas and texts
    assert kinds == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        *["response.reasoning_text.delta"] * deltas,
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        *["response.output_text.delta"] * texts,
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    thinking = [e for e in events if e.type.startswith("response.reasoning_text.")]
    assert "".join(e.delta for e in thinking[:-1]) == thinking[-1].text == THINK_ANSWER
    (reasoning_id,) = {e.item_id for e in thinking}
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [(e.output_index, e.item.type) for e in added] == [(0, "reasoning"), (1, "message")]
    assert added[0].item.id == reasoning_id
    parts = [e.part.type for e in events if e.type.startswith("response.content_part.")]
    assert parts == ["reasoning_text", "reasoning_text", "output_text", "output_text"]
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output[0].id == reasoning_id and final.output[0].content[0].text == THINK_ANSWER
    assert final.output_text == ANSWER


def test_responses_stream_of_a_tool_call_after_reasoning(openai_client, engine):
    tool = {"type": "function", **{k: TOOL["function"][k] for k in ("name", "description", "parameters")}}
    with openai_client.responses.stream(model=engine.name, input="Weather in Paris?", tools=[tool]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    added = [(e.output_index, e.item.type) for e in events if e.type == "response.output_item.added"]
    assert added == [(0, "reasoning"), (1, "function_call")]  # no empty message item between them
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == THINK_CALL
    assert not [e for e in events if e.type == "response.output_text.delta"]
    call = final.output[1]
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
