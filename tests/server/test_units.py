"""The pieces under the routes, tested directly: tool-call splitting, JSON checks, error wording."""

from __future__ import annotations

import random

import pytest

from app.engine.server.errors import ApiError, Dialect, describe_validation_errors
from app.engine.server.json_output import check_json
from app.engine.server.tool_calls import ToolCallSplitter, plan_tools

from .fakes import FakeChatTemplate


def feed_all(splitter: ToolCallSplitter, deltas: list[str]) -> str:
    return "".join(splitter.feed(delta) for delta in deltas)


def test_splitter_streams_text_before_a_marker_split_across_deltas():
    splitter = ToolCallSplitter(FakeChatTemplate(), enabled=True)
    shown = feed_all(splitter, ["Hi <to", "ol_c", 'all>{"name": "f", "arguments": {"a": 1}}</tool_call>'])
    assert shown == "Hi "
    rest, calls = splitter.finish()
    assert rest == "" and [(c.name, c.arguments) for c in calls] == [("f", '{"a": 1}')]


def test_splitter_releases_a_false_alarm_prefix():
    splitter = ToolCallSplitter(FakeChatTemplate(), enabled=True)
    assert feed_all(splitter, ["a <t", "able>"]) == "a <table>"
    assert splitter.finish() == ("", [])


def test_splitter_without_a_known_marker_holds_everything():
    class NoMarker(FakeChatTemplate):
        tool_call_start = None

    splitter = ToolCallSplitter(NoMarker(), enabled=True)
    assert feed_all(splitter, ["plain ", "text"]) == ""
    assert splitter.finish() == ("plain text", [])


def test_disabled_splitter_passes_text_through():
    splitter = ToolCallSplitter(FakeChatTemplate(), enabled=False)
    assert feed_all(splitter, ["<tool_call>", "x"]) == "<tool_call>x"
    assert splitter.finish() == ("", [])


CALL = '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'


@pytest.mark.parametrize("seed", range(40))
def test_splitter_shows_exactly_the_text_before_the_marker_however_the_deltas_fall(seed: int) -> None:
    """Random texts with false alarms ("<to", "<tool_c"), long runs and a call at a random place, cut into random
    deltas (1-9 characters): the shown text is all of it up to the marker, never a character of the marker or
    past it, and the call is parsed at the end; without a call, all of it is shown by the end."""
    rng = random.Random(seed)
    words = ["a", " ", "<to", "<tool_c", "<", "tool_call", ">", "\n", "é中", "x" * 50]
    before = "".join(rng.choice(words) for _ in range(rng.randint(0, 60))).replace("<tool_call>", "<tool_cal>")
    after = "".join(rng.choice(words) for _ in range(rng.randint(0, 20))).replace("<tool_call>", "")
    with_call = seed % 4 != 0
    text = before + CALL + after if with_call else before
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, len(text) // 3))) if len(text) > 1 else []
    deltas = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    splitter = ToolCallSplitter(FakeChatTemplate(), enabled=True)
    shown = feed_all(splitter, deltas)
    rest, calls = splitter.finish()
    if with_call:
        assert shown == before and [(c.name, c.arguments) for c in calls] == [("f", '{"a": 1}')]
    else:
        assert shown + rest == text.strip() or shown == text, (shown, rest)
        assert calls == []


def test_tool_plans():
    tools = [{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "b"}}]
    assert plan_tools(tools, "none").tools is None
    assert plan_tools(tools, "auto").instruction is None
    assert "must" in plan_tools(tools, "required").instruction
    assert plan_tools(tools, "named", "b").tools == [tools[1]]
    with pytest.raises(ApiError, match="'c'"):
        plan_tools(tools, "named", "c")


@pytest.mark.parametrize(
    ("text", "schema", "problem"),
    [
        ('{"a": 1}', None, None),
        ("[1]", None, "output is JSON but not an object"),
        ("nope", None, "output is not valid JSON: Expecting value at position 0"),
        ('{"a": "x"}', {"type": "object", "properties": {"a": {"type": "integer"}}}, "$.a should be integer"),
        (
            '{"a": 1, "b": 2}',
            {"type": "object", "properties": {"a": {}}, "additionalProperties": False},
            "$ has unexpected b",
        ),
        ('{"a": [1, "x"]}', {"properties": {"a": {"items": {"type": "number"}}}}, "$.a[1] should be number"),
        ('{"a": "z"}', {"properties": {"a": {"enum": ["x", "y"]}}}, "$.a should be one of ['x', 'y']"),
        ("true", {"type": "integer"}, "$ should be integer"),
    ],
)
def test_json_checks(text, schema, problem):
    assert check_json(text, schema) == problem


def test_validation_errors_read_like_sentences():
    errors = [
        {
            "type": "string_type",
            "loc": ("body", "messages", 0, "content"),
            "msg": "Input should be a valid string",
        }
    ]
    assert describe_validation_errors(errors) == (
        "Invalid value for 'messages[0].content': Input should be a valid string.",
        "messages[0].content",
    )
    assert describe_validation_errors([{"type": "missing", "loc": ("body",), "msg": "Field required"}])[
        0
    ] == ("The request body must be a JSON object.")


def test_error_shapes():
    error = ApiError(429, "slow down", code="rate_limit_exceeded", headers={"Retry-After": "1"})
    assert error.body(Dialect.OPENAI) == {
        "error": {
            "message": "slow down",
            "type": "rate_limit_error",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
    assert error.body(Dialect.ANTHROPIC) == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "slow down"},
    }
    assert error.response(Dialect.OPENAI).headers["retry-after"] == "1"
