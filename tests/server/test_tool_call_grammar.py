"""The grammars tool_choice and response_format become accept what the tool-call parser reads back,
and nothing else: checked byte by byte with llguidance over a vocabulary of the 256 bytes."""

from __future__ import annotations

import llguidance
import pytest

from app.engine import GrammarSpec
from app.engine.server.errors import ApiError
from app.engine.server.json_output import reply_grammar
from app.engine.server.tool_calls import plan_tools
from app.engine.text.tool_calls import parse_tool_calls

EOS = 256
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
                "required": ["zone"],
            },
        },
    },
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}},
]
CALL = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'


class _Bytes:
    eos_token_id, bos_token_id, special_token_ids = EOS, None, [EOS]
    tokens = [bytes([b]) for b in range(256)] + [b"<eos>"]

    def __call__(self, text: str) -> list[int]:
        return list(text.encode())


BYTES = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()))


def accepts(spec: GrammarSpec | None, text: str) -> bool:
    assert spec is not None
    matcher = llguidance.LLMatcher(BYTES, spec.compiled, log_level=0)
    return matcher.consume_tokens(list(text.encode())) and matcher.is_accepting()


def test_required_admits_tagged_calls_the_parser_reads_back() -> None:
    grammar = plan_tools(TOOLS, "required", call_marker="<tool_call>").grammar
    two = CALL + '\n<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>'
    for text in (CALL, two):
        assert accepts(grammar, text)
        content, calls = parse_tool_calls(text)
        assert content == "" and calls[0].name == "get_time"
    for text in (
        "Sure! " + CALL,  # no text before the call
        CALL.replace("UTC", "PST"),  # arguments outside the tool's schema
        CALL.replace("get_time", "get_date"),  # a tool that does not exist
        CALL.replace(', "arguments": {"zone": "UTC"}', ""),  # arguments missing
        CALL.replace("\n", " "),  # not the format the built-in templates ask for
    ):
        assert not accepts(grammar, text), text


def test_named_and_single_call_choices() -> None:
    named = plan_tools(TOOLS, "named", "ping", call_marker="<tool_call>", parallel=False).grammar
    ping = '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>'
    assert accepts(named, ping)
    assert not accepts(named, CALL) and not accepts(named, ping + "\n" + ping)


def test_templates_without_the_marker_get_a_bare_json_call() -> None:
    grammar = plan_tools(TOOLS, "required").grammar
    bare = '{"name": "get_time", "arguments": {"zone": "CET"}}'
    assert accepts(grammar, bare) and parse_tool_calls(bare)[1][0].name == "get_time"
    assert not accepts(grammar, CALL)


def test_auto_and_none_are_not_constrained_but_json_with_tools_may_be_either() -> None:
    assert plan_tools(TOOLS, "auto", call_marker="<tool_call>").grammar is None
    assert plan_tools(TOOLS, "none").grammar is None
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    auto = plan_tools(TOOLS, "auto", call_marker="<tool_call>")
    either = reply_grammar(auto, schema, True, "response_format")
    assert accepts(either, '{"ok": true}') and accepts(either, CALL)
    assert not accepts(either, '{"ok": 1}') and not accepts(either, "plain text")
    only_json = reply_grammar(plan_tools(None, "auto"), schema, True, "response_format")
    assert accepts(only_json, '{"ok": false}') and not accepts(only_json, CALL)
    forced = reply_grammar(plan_tools(TOOLS, "required", call_marker="<tool_call>"), schema, True, "x")
    assert accepts(forced, CALL) and not accepts(forced, '{"ok": true}')
    assert reply_grammar(auto, None, False, "response_format") is None


def test_refused_schemas_name_their_field() -> None:
    with pytest.raises(ApiError) as refused:
        reply_grammar(plan_tools(None, "auto"), {"type": "strin"}, True, "text.format")
    assert refused.value.param == "text.format" and "strin" in refused.value.message
    bad = [
        {
            "type": "function",
            "function": {"name": "f", "parameters": {"type": "object", "minProperties": "x"}},
        }
    ]
    with pytest.raises(ApiError) as refused:
        plan_tools(bad, "required")
    assert refused.value.param == "tools" and refused.value.message.startswith("tools[0] (f): ")


def test_arguments_hold_only_declared_keys_unless_the_schema_opens_them() -> None:
    """An object schema silent on other keys is closed (as in OpenAI's strict mode): a sampled call
    cannot grow undeclared arguments until max_tokens cuts it off; a schema that opens it keeps it open."""
    nested = {
        "type": "object",
        "properties": {"where": {"type": "object", "properties": {"city": {"type": "string"}}}},
    }
    tools = [{"type": "function", "function": {"name": "f", "parameters": nested}}]
    grammar = plan_tools(tools, "required").grammar
    assert accepts(grammar, '{"name": "f", "arguments": {"where": {"city": "Lyon"}}}')
    assert not accepts(grammar, '{"name": "f", "arguments": {"where": {"city": "Lyon"}, "x": 1}}')
    assert not accepts(grammar, '{"name": "f", "arguments": {"where": {"city": "Lyon", "x": 1}}}')
    opened = {**nested, "additionalProperties": True}
    tools = [{"type": "function", "function": {"name": "f", "parameters": opened}}]
    assert accepts(plan_tools(tools, "required").grammar, '{"name": "f", "arguments": {"x": 1}}')


def _tool(parameters: object) -> list[dict]:
    return [{"type": "function", "function": {"name": "f", "parameters": parameters}}]


NODE = {"type": "object", "properties": {"value": {"type": "integer"}, "next": {"$ref": "#"}}}


def test_local_references_point_into_the_arguments() -> None:
    """A recursive schema ("#") and one with $defs / definitions (what pydantic writes) are enforced as
    the tool means them: the references were rooted at the call, where "#" named the whole call and
    "#/$defs/x" nothing (issue 40: $defs were refused with a 400)."""
    linked = plan_tools(_tool({**NODE, "required": ["value"]}), "required").grammar
    assert accepts(linked, '{"name": "f", "arguments": {"value": 1, "next": {"value": 2}}}')
    assert not accepts(linked, '{"name": "f", "arguments": {"value": 1, "next": {"name": "f"}}}')
    for defs in ("$defs", "definitions"):
        schema = {
            "type": "object",
            "properties": {"u": {"$ref": f"#/{defs}/Unit"}},
            defs: {"Unit": {"enum": ["C"]}},
        }
        grammar = plan_tools(_tool(schema), "required").grammar
        assert accepts(grammar, '{"name": "f", "arguments": {"u": "C"}}')
        assert not accepts(grammar, '{"name": "f", "arguments": {"u": "F"}}')


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"$ref": "#"}, "'#'"),
        ({**NODE, "required": ["next"]}, "'#/properties/next'"),
        (
            {
                "type": "object",
                "properties": {"l": {"type": "array", "items": {"$ref": "#"}, "minItems": 1}},
                "required": ["l"],
            },
            "'#/properties/l/items'",
        ),
        ({"allOf": [{"$ref": "#"}]}, "'#/allOf/0'"),
    ],
    ids=["the root itself", "a required self", "a non-empty list of selves", "allOf of itself"],
)
def test_a_schema_without_a_finite_value_is_refused_naming_the_loop(schema: object, where: str) -> None:
    """Issue 40: `{"$ref": "#"}` under tool_choice "required" compiled, then llguidance's parser gave
    up on the first token and the reply was "<" with no call and a 200."""
    for choice in ("required", "auto"):
        with pytest.raises(ApiError) as refused:
            plan_tools(_tool(schema), choice, call_marker="<tool_call>")
        error = refused.value
        assert error.status == 400 and error.param == "tools"
        assert (
            error.message.startswith("tools[0] (f): its parameters schema has no finite value")
            and where in error.message
        )


def test_a_forced_choice_without_tools_is_refused() -> None:
    for choice, name in (("required", None), ("named", "f")):
        for tools in (None, []):
            with pytest.raises(ApiError) as refused:
                plan_tools(tools, choice, name)
            assert refused.value.param == "tool_choice" and "no tools" in refused.value.message
    assert plan_tools(None, "auto").grammar is None and plan_tools([], "none").tools is None
