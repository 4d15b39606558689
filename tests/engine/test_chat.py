"""Chat templates: checkpoint templates against transformers' rendering, the built-ins, the
sandbox, and tool-call parsing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.engine.text.chat_template import ChatTemplate, builtin_template, chat_template_for
from app.engine.text.tool_calls import ToolCall, parse_tool_calls

FIXTURE = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "tokenizer" / "chat_templates.json").read_text("utf-8")
)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


class VocabOnly:
    """Just what `chat_template_for` asks of a tokenizer."""

    def __init__(self, tokens: list[str], bos: str | None = None, eos: str | None = None) -> None:
        self._ids = {token: index for index, token in enumerate(tokens)}
        self.bos_token, self.eos_token, self.chat_template = bos, eos, None

    def token_to_id(self, token: str) -> int | None:
        return self._ids.get(token)


# -- checkpoint templates ---------------------------------------------------------------------


@pytest.mark.parametrize("case", FIXTURE["cases"], ids=lambda c: f"{c['template']}-{len(c['messages'])}")
def test_checkpoint_template_renders_as_transformers(case: dict[str, Any]) -> None:
    template = ChatTemplate(FIXTURE["templates"][case["template"]], source="checkpoint", bos_token="<bos>")
    rendered = template.render(
        case["messages"], tools=case.get("tools"), add_generation_prompt=case["add_generation_prompt"]
    )
    assert rendered == case["rendered"]


def test_tool_call_arguments_as_json_text_render_like_objects() -> None:
    case = next(c for c in FIXTURE["cases"] if c["template"] == "hermes" and c.get("tools"))
    messages = json.loads(json.dumps(case["messages"]))
    for call in messages[1]["tool_calls"]:  # OpenAI clients send arguments as JSON text
        call["function"]["arguments"] = json.dumps(call["function"]["arguments"])
    template = ChatTemplate(FIXTURE["templates"]["hermes"], source="checkpoint")
    rendered = template.render(
        messages, tools=case["tools"], add_generation_prompt=case["add_generation_prompt"]
    )
    assert rendered == case["rendered"]
    assert case["messages"][1]["tool_calls"][0]["function"]["arguments"] == {
        "city": "Zürich"
    }  # input untouched


def test_template_found_in_gguf_metadata_with_tool_use_variant() -> None:
    metadata = {
        "tokenizer.chat_template": "plain:{{ messages[0].content }}",
        "tokenizer.chat_template.tool_use": "tools:{{ tools | length }}",
    }
    template = chat_template_for(metadata, VocabOnly([]), "llama")
    assert template.source == "checkpoint"
    assert template.render([{"role": "user", "content": "hi"}]) == "plain:hi"
    assert template.render([{"role": "user", "content": "hi"}], tools=[WEATHER_TOOL]) == "tools:1"


def test_template_found_in_a_model_folder(tmp_path: Path) -> None:
    named = [{"name": "default", "template": "D{{ bos_token }}"}, {"name": "tool_use", "template": "T"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    template = chat_template_for(tmp_path, VocabOnly([], bos="<s>"), "qwen2")
    assert template.source == "checkpoint" and template.render([]) == "D<s>"
    assert template.render([], tools=[WEATHER_TOOL]) == "T"
    (tmp_path / "chat_template.jinja").write_text("J{{ messages | length }}")
    assert (
        chat_template_for(tmp_path, VocabOnly([]), "qwen2").render([{"role": "user", "content": "x"}]) == "J1"
    )


def test_template_carried_by_the_tokenizer() -> None:
    tokenizer = VocabOnly([])
    tokenizer.chat_template = "{{ messages[0].content | upper }}"
    assert chat_template_for({}, tokenizer, "llama").render([{"role": "user", "content": "hi"}]) == "HI"


def test_globals_and_filters_that_hf_templates_use() -> None:
    source = (
        "{{ {'city': 'Zürich <3'} | tojson }}|{{ [1] | tojson(indent=2) }}|{{ strftime_now('%Y') | length }}"
        "|{{ eos_token }}|{{ enable_thinking }}"
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}|{{ m.content }}{% endfor %}"
    )
    rendered = ChatTemplate(source, source="checkpoint", eos_token="<eos>").render(
        [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], enable_thinking=False
    )
    assert rendered == '{"city": "Zürich <3"}|[\n  1\n]|4|<eos>|False|a'


def test_template_errors_become_value_errors() -> None:
    with pytest.raises(ValueError, match="does not parse"):
        ChatTemplate("{% if %}", source="checkpoint")
    failing = ChatTemplate("{{ raise_exception('roles must alternate') }}", source="checkpoint")
    with pytest.raises(ValueError, match="roles must alternate"):
        failing.render([{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="checkpoint"):
        ChatTemplate("{{ no_such_function() }}", source="checkpoint").render([])
    with pytest.raises(ValueError, match="checkpoint"):
        ChatTemplate("{{ 1 + 'a' }}", source="checkpoint").render([])


def test_missing_content_renders_as_empty_text() -> None:
    template = ChatTemplate(
        "{% for m in messages %}[{{ m.content | trim }}]{% endfor %}", source="checkpoint"
    )
    assert template.render([{"role": "assistant", "content": None, "tool_calls": []}]) == "[]"


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ raise_exception.__globals__ }}",
        "{{ messages.__class__ }}",
        "{{ cycler.__init__.__globals__.os }}",
        "{% set items = [] %}{{ items.append(1) }}",  # the sandbox is immutable
        "{{ messages[0].update({'role': 'system'}) }}",
    ],
)
def test_sandbox_refuses_internals_and_mutation(source: str) -> None:
    with pytest.raises(ValueError, match="chat template"):
        ChatTemplate(source, source="checkpoint").render([{"role": "user", "content": "hi"}])


def test_messages_are_checked_and_normalized() -> None:
    echo = ChatTemplate(
        "{% for m in messages %}{{ m.role }}={{ m.content }};{% endfor %}", source="checkpoint"
    )
    parts = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    assert echo.render([{"role": "developer", "content": parts}]) == "system=one\ntwo;"
    with pytest.raises(ValueError, match=r"messages\[0\].*image_url"):
        echo.render([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    with pytest.raises(ValueError, match=r"messages\[1\].*role"):
        echo.render([{"role": "user", "content": "a"}, {"content": "b"}])


# -- built-ins --------------------------------------------------------------------------------


def test_embedded_gemma_gets_the_builtin_gemma_template(embedded_checkpoint: Any) -> None:
    metadata = embedded_checkpoint.metadata
    assert "tokenizer.chat_template" not in metadata
    tokenizer = VocabOnly(list(metadata["tokenizer.ggml.tokens"]), bos="<bos>", eos="<eos>")
    template = chat_template_for(metadata, tokenizer, "gemma3")
    assert template.source == "builtin:gemma"
    assert template.stop_strings == ("<end_of_turn>",)
    assert template.tool_call_start == "<tool_call>"


def test_gemma_builtin_is_gemmas_official_format() -> None:
    gemma = builtin_template("gemma", bos_token="<bos>")
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi "},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "2+2?"},
    ]
    assert gemma.render(messages) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\n2+2?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    assert (
        gemma.render(messages[1:2], add_generation_prompt=False)
        == "<bos><start_of_turn>user\nHi<end_of_turn>\n"
    )


@pytest.mark.parametrize(
    ("name", "answer_at"),
    [("gemma", "<start_of_turn>model\n"), ("llama3", "<|start_header_id|>assistant<|end_header_id|>\n\n")],
)
def test_builtins_write_an_answer_back_as_the_model_wrote_it(name: str, answer_at: str) -> None:
    """Other turns are trimmed, as the families' templates do; an assistant's text is not, so the
    next turn's prompt repeats the previous answer's tokens (its KV is in the prefix cache)."""
    answer = " Hello!\n\n"
    messages = [
        {"role": "user", "content": " Hi \n"},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "2+2?"},
    ]
    rendered = builtin_template(name).render(messages)
    assert answer_at + answer in rendered
    assert " Hi \n" not in rendered and "Hi" in rendered


def test_chatml_and_llama3_builtins() -> None:
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert builtin_template("chatml").render(messages) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    )
    assert builtin_template("llama3", bos_token="<|begin_of_text|>").render(messages) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    with pytest.raises(ValueError, match="chatml"):
        builtin_template("no-such")


@pytest.mark.parametrize(
    ("tokens", "architecture", "expected"),
    [
        (["<|start_header_id|>", "<|eot_id|>"], "llama", "builtin:llama3"),
        (["<|im_start|>", "<|im_end|>"], "llama", "builtin:chatml"),
        ([], "qwen3", "builtin:chatml"),
        ([], "gemma2", "builtin:gemma"),
        ([], "mystery", "builtin:chatml"),
    ],
)
def test_builtin_chosen_by_vocabulary_then_architecture(
    tokens: list[str], architecture: str, expected: str
) -> None:
    assert chat_template_for({}, VocabOnly(tokens), architecture).source == expected


@pytest.mark.parametrize("name", ["gemma", "chatml", "llama3"])
def test_builtins_render_tools_calls_and_results(name: str) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Zürich?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 21}'},
    ]
    rendered = builtin_template(name).render(messages, tools=[WEATHER_TOOL])
    schema = json.dumps(WEATHER_TOOL["function"], ensure_ascii=False)
    assert schema in rendered and "<tools>" in rendered and "Be brief." in rendered
    assert rendered.index("Be brief.") < rendered.index(schema) < rendered.index("Weather in Zürich?")
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>' in rendered
    assert '{"temp": 21}' in rendered and rendered.index("</tool_call>") < rendered.index('{"temp": 21}')
    # what the model is asked to write back parses as a call
    assert parse_tool_calls(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Bern"}}\n</tool_call>'
    )[1]
    without_tools = builtin_template(name).render(messages[:2])
    assert "<tools>" not in without_tools


# -- parsing tool calls --------------------------------------------------------------------------


def _calls(text: str) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    content, calls = parse_tool_calls(text)
    assert all(isinstance(call, ToolCall) and call.id for call in calls)
    return content, [(call.name, json.loads(call.arguments)) for call in calls]


def test_parses_hermes_tagged_calls() -> None:
    text = (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>\n'
        '<tool_call>  {"name":"get_weather","arguments":{"city":"Bern"}}  </tool_call>'
    )
    assert _calls(text) == (
        "Let me check.",
        [("get_weather", {"city": "Zürich"}), ("get_weather", {"city": "Bern"})],
    )


def test_parses_an_unclosed_final_call() -> None:
    assert _calls('<tool_call>{"name": "f", "arguments": {}}') == ("", [("f", {})])


def test_parses_llama3_bare_json() -> None:
    assert _calls('{"name": "get_weather", "parameters": {"city": "Paris"}}') == (
        "",
        [("get_weather", {"city": "Paris"})],
    )
    assert _calls('<|python_tag|>{"name": "f", "parameters": {"x": 1}}') == ("", [("f", {"x": 1})])
    assert _calls('  [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"y": [1]}}]\n') == (
        "",
        [("a", {}), ("b", {"y": [1]})],
    )


def test_parses_fenced_json_blocks() -> None:
    text = 'Calling now:\n```json\n{"name": "search", "arguments": {"q": "paddock"}}\n```\nDone.'
    assert _calls(text) == ("Calling now:\n\nDone.", [("search", {"q": "paddock"})])


def test_arguments_given_as_json_text_are_kept() -> None:
    content, calls = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert content == "" and calls[0].arguments == '{"a": 1}'


@pytest.mark.parametrize(
    "text",
    [
        "Just an answer.",
        '<tool_call>{"name": "f", "arguments": {"a": 1}</tool_call>',  # invalid JSON
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        '{"answer": 42}',  # JSON, but not a call
        "```json\n[1, 2, 3]\n```",
        '{"name": "f", "arguments": "not json"}',
    ],
)
def test_text_that_is_not_a_valid_call_stays_content(text: str) -> None:
    assert parse_tool_calls(text) == (text, [])


def test_template_method_parses_too() -> None:
    content, calls = builtin_template("chatml").parse_tool_calls(
        '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    )
    assert content == "" and [c.name for c in calls] == ["f"]
