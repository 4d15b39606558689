"""Chat templates from model files render within a time and a size limit: hostile templates fail
fast with a clear error and bounded memory, and one that breaks the limits at load is refused for
the family's built-in template. Real templates are untouched."""

from __future__ import annotations

import json
import logging
import tracemalloc
from pathlib import Path

import pytest

from app.engine.text.chat_template import ChatTemplate, chat_template_for
from app.engine.text.template_sandbox import MAX_RENDER_CHARS, Limits, TemplateLimitError

FIXTURE = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "tokenizer" / "chat_templates.json").read_text("utf-8")
)
HELLO = [{"role": "user", "content": "hello"}]
FAST = Limits(seconds=1.0)  # the time limit these tests run under (the default is 2 s)

HOSTILE = {
    "nested range loop with output": (
        "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
        "time limit",
    ),
    "nested range loop without output": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "time limit",
    ),
    "string times a billion": ("{{ 'x' * 1000000000 }}", "str * 1000000000"),
    "a billion times a list": ("{{ (1000000000 * [1]) | length }}", "list * 1000000000"),
    "doubling by concatenation": (
        "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
        "{{ ns.s | length }}",
        "~ concatenation",
    ),
    "doubling by plus": (
        "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
        "str + str",
    ),
    "a huge power": ("{{ 10 ** 1000000000 }}", "10 ** 1000000000 would have"),
    "a padding method": ("{{ 'x'.center(1000000000) }}", "calling center"),
    "a padding filter": ("{{ 'x' | center(1000000000) }}", "the center filter"),
    "a batch filter that fills": ("{{ [1] | batch(1000000000, 0) | list | length }}", "the batch filter"),
    "a wide % format": ("{{ '%01000000000d' % 1 }}", "width of 8 or more digits"),
    "a wide str.format": ("{{ '{:>1000000000}'.format(1) }}", "width of 8 or more digits"),
    "a range too long": ("{% for i in range(10000000) %}{% endfor %}", "range of 10000000 items"),
    "endless recursion": ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "recursed too deep"),
}


@pytest.mark.parametrize("case", HOSTILE, ids=list(HOSTILE))
def test_a_hostile_template_fails_with_a_clear_error_and_bounded_memory(case):
    text, message = HOSTILE[case]
    template = ChatTemplate(text, source="checkpoint")
    tracemalloc.start()
    try:
        with pytest.raises(TemplateLimitError, match="chat template \\(checkpoint\\)") as raised:
            template.render_within(FAST, HELLO)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert message in str(raised.value)
    assert peak < 2 * MAX_RENDER_CHARS  # never the gigabytes the template asked for


REPEATED = {  # each step within the size limit, the steps together not
    "~": "{% set big = 'x' * 30000000 %}{% for i in range(100000) %}{% set s = big ~ big %}{% endfor %}",
    "+": "{% set big = 'x' * 30000000 %}{% for i in range(100000) %}{% set s = big + big %}{% endfor %}",
}


@pytest.mark.parametrize("operator", REPEATED)
def test_big_values_built_again_and_again_in_a_loop_are_bounded_in_total(operator):
    """The time limit is set far away, so what stops the render is the total it built: about 18 steps
    of 60 M characters (the old per-value check let all 100,000 steps run until the deadline)."""
    template = ChatTemplate(REPEATED[operator], source="checkpoint")
    with pytest.raises(TemplateLimitError, match="characters in all"):
        template.render_within(Limits(seconds=600), HELLO)


def test_the_output_size_limit_stops_a_render_that_writes_too_much():
    template = ChatTemplate("{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}", source="checkpoint")
    with pytest.raises(TemplateLimitError, match="the rendered prompt would make"):
        template.render_within(Limits(seconds=60, chars=10**6), HELLO)


def test_ordinary_template_code_is_not_limited():
    text = (
        "{% for i in range(3) %}{{ '-' * 3 }}{{ i }}{% endfor %}|{{ 1733000000 | string }}|"
        "{{ messages | length }}|{{ '%05d' % 42 }}|{{ '{:>4}'.format(7) }}|{{ 2 ** 10 }}|"
        "{{ messages[0].content | center(9) }}|{{ (range(4) | list)[2] }}"
    )
    rendered = ChatTemplate(text, source="checkpoint").render(HELLO)
    assert rendered == "---0---1---2|1733000000|1|00042|   7|1024|  hello  |2"


@pytest.mark.parametrize("name", sorted(FIXTURE["templates"]))
def test_real_templates_pass_the_load_probe(name):
    ChatTemplate(FIXTURE["templates"][name], source="checkpoint").probe()


class VocabOnly:
    bos_token, eos_token, chat_template = "<bos>", None, None

    def __init__(self, tokens: list[str]) -> None:
        self._tokens = tokens

    def token_to_id(self, token: str) -> int | None:
        return self._tokens.index(token) if token in self._tokens else None


@pytest.mark.parametrize("case", ["string times a billion", "nested range loop with output"])
def test_a_template_that_breaks_the_limits_at_load_is_refused_for_the_builtin(case, caplog):
    metadata = {"tokenizer.chat_template": HOSTILE[case][0]}
    with caplog.at_level(logging.WARNING, logger="app.engine.text.chat_template"):
        template = chat_template_for(metadata, VocabOnly(["<start_of_turn>"]), "gemma3")
    assert template.source == "builtin:gemma"
    assert (
        template.refused is not None and "chat template (checkpoint) exceeded its limits" in template.refused
    )
    assert "using the built-in gemma template instead" in caplog.text
    assert template.render(HELLO).endswith("<start_of_turn>model\n")


def test_a_template_that_only_refuses_the_probe_conversation_is_kept():
    metadata = {"tokenizer.chat_template": "{{ raise_exception('tools are not supported') if tools }}ok"}
    template = chat_template_for(metadata, VocabOnly([]), "llama")
    assert template.source == "checkpoint" and template.refused is None
    assert template.render(HELLO) == "ok"
