"""A Gemma 4 reply streamed through the APIs, on a scripted token sequence: its thought channel as reasoning,
its `<|tool_call>call:NAME{...}<tool_call|>` calls (strings in the `<|"|>` token) as tool calls.

The engine is the fake (fakes.py) with Gemma 4's markers as single special tokens, whose text is dropped when
a request asks for `skip_special_tokens`, as a real tokenizer does. The chat template is a short stand-in in
Gemma 4's markup (turns, tool calls and responses as the published template writes them); what is checked is
that a template in this markup makes the server parse replies in it. The scripted replies are what Gemma 4
writes: `<|channel>thought\\n...<channel|>`, then a call or the answer, ending on `<turn|>` (not printed).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from app.engine.text.chat_template import ChatTemplate

from .conftest import running_server
from .fakes import MarkupTokenizer, ToolTurnEngine
from .helpers import WEATHER_TOOL as TOOL
from .helpers import sse_events

SPECIALS = ["<eos>", "<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", '<|"|>',
            "<|tool_response>", "<tool_response|>"]  # fmt: skip
THINK_CALL = "The user wants the weather in Paris, so I call get_weather."
THINK_ANSWER = "The tool said 21 C; answer briefly."
ANSWER = "It is 21 C in Paris."
CALL_REPLY = (
    f"<|channel>thought\n{THINK_CALL}<channel|>"
    '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:2,metric:true}<tool_call|><turn|>'
)
ANSWER_REPLY = f"<|channel>thought\n{THINK_ANSWER}<channel|>{ANSWER}<turn|>"
TEMPLATE = (
    "{{ bos_token }}{% if tools %}<|turn>system\n{% for t in tools %}{{ t.function.name }}\n{% endfor %}<turn|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}<|tool_response>response:get_weather{value:<|\"|>{{ m.content }}<|\"|>}<tool_response|>"
    "{% else %}<|turn>{{ 'model' if m.role == 'assistant' else m.role }}\n"
    "{% for c in m.tool_calls or [] %}<|tool_call>call:{{ c.function.name }}{}<tool_call|>{% endfor %}"
    "{{ m.content or '' }}<turn|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|turn>model\n{% endif %}"
)


@pytest.fixture(scope="module")
def engine() -> ToolTurnEngine:
    template = ChatTemplate(TEMPLATE, source="checkpoint", stop_strings=("<turn|>",))
    return ToolTurnEngine(
        tokenizer=MarkupTokenizer(SPECIALS, ("<turn|>", "<eos>")), chat_template=template,  # type: ignore[arg-type]
        call_reply=CALL_REPLY, answer_reply=ANSWER_REPLY, tools_mark="get_weather\n", user_mark="<|turn>user",
        result_mark="<tool_response|>",
    )  # fmt: skip


@pytest.fixture(scope="module")
def server(engine: ToolTurnEngine) -> Iterator:
    with running_server(engine) as handle:
        yield handle


def test_a_gemma4_template_asks_for_special_tokens(openai_client, engine):
    assert engine.chat_template.reply_format == "gemma4"
    openai_client.chat.completions.create(
        model=engine.name, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[TOOL]
    )
    assert engine.requests[-1].sampling_params.skip_special_tokens is False


def test_openai_stream_separates_the_thought_and_parses_the_call(openai_client, engine):
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
        ("get_weather", {"city": "Paris", "days": 2, "metric": True})
    ]
    assert finish == "tool_calls"


def test_openai_answer_after_the_tool_result(openai_client, engine):
    turns = [{"role": "user", "content": "Weather in Paris?"}]
    first = openai_client.chat.completions.create(model=engine.name, messages=turns, tools=[TOOL])
    message = first.choices[0].message
    assert message.model_extra["reasoning_content"] == THINK_CALL and message.content in (None, "")
    (call,) = message.tool_calls
    turns += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "21 C"},
    ]
    reply = openai_client.chat.completions.create(model=engine.name, messages=turns, tools=[TOOL])
    assert reply.choices[0].message.content == ANSWER
    assert reply.choices[0].message.model_extra["reasoning_content"] == THINK_ANSWER
    assert (
        reply.usage.completion_tokens_details.reasoning_tokens
        == len(f"\n{THINK_ANSWER}") + len("thought") + 2
    )


def test_anthropic_stream_has_a_thinking_block_then_the_tool_use(server, engine):
    tool = {"name": "get_weather", "description": "weather", "input_schema": TOOL["function"]["parameters"]}
    body = {"model": engine.name, "max_tokens": 300, "stream": True, "tools": [tool],
            "messages": [{"role": "user", "content": "Weather in Paris?"}]}  # fmt: skip
    events = sse_events(httpx.post(f"{server.base_url}/v1/messages", json=body, timeout=30))
    starts = [data["content_block"]["type"] for name, data in events if name == "content_block_start"]
    assert starts == ["thinking", "tool_use"]
    thinking = "".join(d["delta"].get("thinking", "") for n, d in events if n == "content_block_delta")
    assert thinking == THINK_CALL
