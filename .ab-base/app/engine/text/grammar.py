"""What a request's output must match: a JSON schema, any JSON object, or a Lark grammar.

A `GrammarSpec` is compiled and checked by llguidance when it is made, so one that exists is
one the sampler can serve (`sample/grammar.py` turns it into a per-request matcher and a token
mask). JSON is written compactly, `{"a": 1, "b": [2, 3]}`: no free whitespace, which a small
model would otherwise fill with newlines until it runs out of tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

import llguidance

GrammarKind = Literal["json_schema", "json_object", "lark"]

# JSON as the built-in chat templates show it; a schema's own "x-guidance" options override these.
COMPACT_JSON: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class GrammarSpec:
    """`source`: the JSON schema's text (kind "json_schema"), the Lark grammar ("lark"), or "" for
    any JSON object. Build one with `json_schema()`, `json_object()` or `lark()`; ValueError says
    what the library refused."""

    kind: GrammarKind
    source: str
    compiled: str = field(init=False, repr=False, compare=False)  # llguidance's grammar text

    def __post_init__(self) -> None:
        if self.kind == "lark":
            compiled = llguidance.LLMatcher.grammar_from_lark(self.source)
        else:
            schema = self.source if self.kind == "json_schema" else '{"type": "object"}'
            try:
                compiled = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=COMPACT_JSON)  # type: ignore[arg-type]
            except ValueError as exc:
                raise ValueError(f"the JSON schema is not valid JSON: {exc}") from exc
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(compiled)
        if failed:
            raise ValueError(f"the {_NAMES[self.kind]} cannot be enforced: {messages[0]}")
        object.__setattr__(self, "compiled", compiled)

    @classmethod
    def json_schema(cls, schema: dict[str, Any]) -> GrammarSpec:
        if not isinstance(schema, dict):
            raise ValueError(f"a JSON schema must be an object, not {type(schema).__name__}")
        return cls("json_schema", json.dumps(schema, ensure_ascii=False))

    @classmethod
    def json_object(cls) -> GrammarSpec:
        return cls("json_object", "")

    @classmethod
    def lark(cls, grammar: str) -> GrammarSpec:
        return cls("lark", grammar)

    @staticmethod
    def lark_json(schema: dict[str, Any], options: dict[str, Any] | None = None) -> str:
        """A Lark `%json` expression for `schema`, compact unless the schema says otherwise;
        `options` (llguidance's JSON options, e.g. {"lenient": True}) come before the schema's own."""
        merged = {**COMPACT_JSON, **(options or {}), **schema.get("x-guidance", {})}
        return "%json " + json.dumps({**schema, "x-guidance": merged}, ensure_ascii=False)


_NAMES: dict[str, str] = {"json_schema": "JSON schema", "json_object": "JSON object", "lark": "grammar"}
