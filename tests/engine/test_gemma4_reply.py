"""Gemma 4's reply format (text/gemma4_reply.py): thought channel, answer and tool calls, whole or streamed."""

from __future__ import annotations

import json
import random

import pytest

from app.engine.text.chat_template import reply_format_of
from app.engine.text.gemma4_reply import Gemma4Stream, parse_call, parse_reply
from app.engine.text.harmony import CONTENT, REASONING

Q = '<|"|>'
REPLY = (
    "<|channel>thought\nCheck the weather first.<channel|>Sure, let me look."
    f"<|tool_call>call:get_weather{{location:{Q}Paris, FR{Q},days:3,units:{{metric:true,scale:null}},"
    f"tags:[{Q}a, b{Q},2.5]}}<tool_call|><turn|>"
)


def test_a_reply_splits_into_thought_answer_and_call() -> None:
    reply = parse_reply(REPLY)
    assert reply.reasoning == "Check the weather first."
    assert reply.content == "Sure, let me look."
    [call] = reply.calls
    assert call.name == "get_weather"
    assert json.loads(call.arguments) == {
        "location": "Paris, FR", "days": 3, "units": {"metric": True, "scale": None}, "tags": ["a, b", 2.5]
    }  # fmt: skip


@pytest.mark.parametrize("seed", range(40))
def test_streamed_in_any_pieces_it_says_the_same(seed: int) -> None:
    rng, stream, pieces, at = random.Random(seed), Gemma4Stream(), [], 0
    while at < len(REPLY):
        step = rng.randint(1, 5)
        pieces += stream.feed(REPLY[at : at + step])
        at += step
    pieces += stream.finish()
    whole = parse_reply(REPLY)
    assert "".join(t for k, t in pieces if k == REASONING) == whole.reasoning
    assert "".join(t for k, t in pieces if k == CONTENT) == whole.content
    assert [c.arguments for c in stream.reply.calls] == [c.arguments for c in whole.calls]


def test_nothing_of_a_marker_is_shown_before_it_is_complete() -> None:
    stream = Gemma4Stream()
    assert stream.feed("Hello <|tool") == [(CONTENT, "Hello ")]
    assert stream.feed("_call>call:f{a:1}<tool_") == []
    assert stream.feed("call|> bye") == [(CONTENT, " bye")]
    assert [c.name for c in stream.reply.calls] == ["f"]


def test_a_call_that_does_not_parse_stays_in_the_answer_and_a_cut_thought_is_closed() -> None:
    reply = parse_reply("<|tool_call>call:f{a:<tool_call|>")
    assert reply.calls == [] and reply.content == "call:f{a:"
    cut = parse_reply("<|channel>thought\nstill thinking when max_tokens came")
    assert cut.reasoning == "still thinking when max_tokens came" and cut.content == ""


def test_argument_syntax() -> None:
    assert parse_call("call:f{}") == ("f", {})
    assert parse_call(f'call:f{{"quoted key":{Q}x{Q}, n: -2, ok:false, s:"json"}}') == (
        "f", {"quoted key": "x", "n": -2, "ok": False, "s": "json"}
    )  # fmt: skip
    assert parse_call("call:f{a:1} trailing") is None and parse_call("f{a:1}") is None


def test_templates_choose_the_format_by_their_markers() -> None:
    assert reply_format_of("<|turn>model\n{% if tools %}<|tool_call>{% endif %}") == "gemma4"
    assert reply_format_of("<|start|>assistant<|channel|>final<|message|>") == "harmony"
    assert reply_format_of("<start_of_turn>model\n") is None
