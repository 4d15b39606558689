"""The harmony format (GPT-OSS): the built-in renderer against the published layout, and the reply
parser, whole and streamed at every split point.

The worked example below is written out by hand from the harmony format's published description
(the system message with identity, knowledge cutoff, reasoning effort and channels; the developer
message with instructions and the `namespace functions` tool block; turns closed by `<|end|>`, tool
calls by `<|call|>`, the prompt ending in `<|start|>assistant`).
"""

from __future__ import annotations

import json

import pytest

from app.engine.text.chat_template import ChatTemplate, chat_template_for
from app.engine.text.harmony import HarmonyStream, parse_header, parse_reply
from app.engine.text.harmony_render import HarmonyTemplate, render

TOOL = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Gets the current weather in the provided location.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
                "format": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
            },
            "required": ["location"],
        },
    },
}
EXPECTED_PROMPT = (
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\n"
    "Current date: 2025-06-28\n\n"
    "Reasoning: high\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message.\n"
    "Calls to these tools must go to the commentary channel: 'functions'.<|end|>"
    "<|start|>developer<|message|># Instructions\n\nAlways respond in riddles\n\n"
    "# Tools\n\n## functions\n\nnamespace functions {\n\n"
    "// Gets the current weather in the provided location.\n"
    "type get_current_weather = (_: {\n"
    "// The city and state, e.g. San Francisco, CA\n"
    "location: string,\n"
    'format?: "celsius" | "fahrenheit", // default: celsius\n'
    "}) => any;\n\n"
    "} // namespace functions<|end|>"
    "<|start|>user<|message|>What is the weather like in SF?<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_current_weather <|constrain|>json"
    '<|message|>{"location":"San Francisco"}<|call|>'
    "<|start|>functions.get_current_weather to=assistant<|channel|>commentary"
    '<|message|>{"sunny": true, "temperature": 20}<|end|>'
    "<|start|>assistant"
)
CONVERSATION = [
    {"role": "system", "content": "Always respond in riddles"},
    {"role": "user", "content": "What is the weather like in SF?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_current_weather", "arguments": '{"location":"San Francisco"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": '{"sunny": true, "temperature": 20}'},
]
REPLIES = {
    "call": (
        "<|channel|>analysis<|message|>Need the weather: call the tool.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_current_weather <|constrain|>json"
        '<|message|>{"location": "Paris"}<|call|>'
    ),
    "answer": (
        "<|channel|>analysis<|message|>It is sunny, 20 degrees. A riddle <then>.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>What shines on you at 20 degrees?<|return|>"
    ),
    # The engine stops on <|return|> without printing it; a preamble to the user on commentary.
    "unterminated": (
        "<|channel|>commentary<|message|>Checking.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Done: a < b"
    ),
}
EXPECTED = {
    "call": ("Need the weather: call the tool.", "", [("get_current_weather", {"location": "Paris"})]),
    "answer": ("It is sunny, 20 degrees. A riddle <then>.", "What shines on you at 20 degrees?", []),
    "unterminated": ("", "Checking.Done: a < b", []),
}


def test_render_matches_the_published_layout():
    prompt = render(CONVERSATION, [TOOL], reasoning_effort="high", current_date="2025-06-28")
    assert prompt == EXPECTED_PROMPT


def test_template_takes_reasoning_effort_from_template_kwargs_and_refuses_unknown_ones():
    template = HarmonyTemplate()
    assert "Reasoning: low" in template.render(CONVERSATION[:2], reasoning_effort="low")
    with pytest.raises(ValueError, match="reasoning_effort"):
        template.render(CONVERSATION[:2], reasoning_effort="maximal")


@pytest.mark.parametrize("name", list(REPLIES))
def test_reply_is_split_into_reasoning_answer_and_calls(name):
    reply = parse_reply(REPLIES[name])
    reasoning, content, calls = EXPECTED[name]
    assert (reply.reasoning, reply.content) == (reasoning, content)
    assert [(c.name, json.loads(c.arguments)) for c in reply.calls] == calls


@pytest.mark.parametrize("name", list(REPLIES))
def test_streamed_at_every_split_the_pieces_add_up_to_the_whole(name):
    text = REPLIES[name]
    whole = parse_reply(text)
    for cut in range(1, len(text)):
        stream = HarmonyStream()
        pieces = stream.feed(text[:cut]) + stream.feed(text[cut:]) + stream.finish()
        assert "".join(t for k, t in pieces if k == "reasoning") == whole.reasoning, cut
        assert "".join(t for k, t in pieces if k == "content") == whole.content, cut
        assert all("<|" not in t for _, t in pieces), (cut, pieces)
        assert [(c.name, c.arguments) for c in stream.reply.calls] == [
            (c.name, c.arguments) for c in whole.calls
        ]


def test_a_rendered_tool_call_parses_back_to_the_same_call():
    prompt = render(CONVERSATION[:3], add_generation_prompt=False)
    turn = prompt[prompt.rindex("<|start|>assistant") + len("<|start|>assistant") :]
    (call,) = parse_reply(turn).calls
    assert (call.name, json.loads(call.arguments)) == ("get_current_weather", {"location": "San Francisco"})


def test_headers_with_the_recipient_before_or_after_the_channel():
    before = parse_header("assistant to=functions.lookup<|channel|>commentary json")
    after = parse_header("assistant<|channel|>commentary to=functions.lookup <|constrain|>json")
    assert before == after
    assert (before.channel, before.recipient, before.kind) == ("commentary", "functions.lookup", None)
    assert parse_header("<|channel|>analysis").kind == "reasoning"


def test_gpt_oss_gets_harmony_and_a_harmony_checkpoint_template_parses_channels():
    template = chat_template_for({}, None, "gpt-oss")
    assert isinstance(template, HarmonyTemplate)
    assert template.stop_strings == ("<|return|>", "<|call|>")
    checkpoint = ChatTemplate(
        "{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endfor %}"
        "<|start|>assistant{# <|channel|> #}",
        source="checkpoint",
    )
    assert checkpoint.reply_format == "harmony"
    reply = checkpoint.parse_reply(REPLIES["answer"])
    assert reply.content == EXPECTED["answer"][1]
    assert checkpoint.parse_tool_calls(REPLIES["call"])[1][0].name == "get_current_weather"
