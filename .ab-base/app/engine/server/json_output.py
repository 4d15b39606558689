"""`response_format` JSON modes: enforced while sampling, asked for in the prompt, checked afterwards.

The reply's grammar (`reply_grammar`) admits only JSON (an object for json_object; a value
matching the schema for json_schema) or, where tools may be called too, tool calls instead. The
model is also instructed through the system turn, and the finished text is still checked: a reply
cut short by max_tokens is not valid JSON. A mismatch is reported in the choice's `json_error`
extension field rather than by altering the text.
"""

from __future__ import annotations

import json
from typing import Any

from app.engine import GrammarSpec
from app.engine.server.errors import bad_request
from app.engine.server.tool_calls import ToolPlan

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "null": (type(None),),
}


def json_instruction(schema: dict[str, Any] | None) -> str:
    if schema is None:
        return "Respond only with a valid JSON object, without any other text."
    return (
        "Respond only with a JSON value that matches this JSON schema, without any other text:\n"
        + json.dumps(schema, ensure_ascii=False)
    )


def reply_grammar(
    tools: ToolPlan, schema: dict[str, Any] | None, wants_json: bool, param: str
) -> GrammarSpec | None:
    """What the reply is held to: forced tool calls; else JSON (or tool calls, where the model may
    call one); else nothing. A schema the grammar library refuses is a 400 naming `param`."""
    if tools.grammar is not None or not wants_json:
        return tools.grammar
    try:
        if tools.calls_rule is None:
            return GrammarSpec.json_schema(schema) if schema is not None else GrammarSpec.json_object()
        answer = GrammarSpec.lark_json(schema if schema is not None else {"type": "object"})
        return GrammarSpec.lark(f"start: calls | answer\nanswer: {answer}\n{tools.calls_rule}")
    except ValueError as exc:
        raise bad_request(f"{param}: {str(exc).splitlines()[0]}", param=param) from exc


def check_json(text: str, schema: dict[str, Any] | None) -> str | None:
    """None when `text` is JSON (matching `schema` if given); otherwise what is wrong."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"output is not valid JSON: {exc.msg} at position {exc.pos}"
    if schema is None:
        return None if isinstance(value, dict) else "output is JSON but not an object"
    return _check(value, schema, "$")


def _check(value: Any, schema: dict[str, Any], where: str) -> str | None:
    expected = schema.get("type")
    if expected is not None:
        names = expected if isinstance(expected, list) else [expected]
        if not any(_is_type(value, name) for name in names):
            return f"{where} should be {' or '.join(names)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} should be one of {schema['enum']}"
    if "const" in schema and value != schema["const"]:
        return f"{where} should be {schema['const']!r}"
    if isinstance(value, dict):
        return _check_object(value, schema, where)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            if problem := _check(item, schema["items"], f"{where}[{index}]"):
                return problem
    return None


def _check_object(value: dict[str, Any], schema: dict[str, Any], where: str) -> str | None:
    properties = schema.get("properties") or {}
    missing = [key for key in schema.get("required", []) if key not in value]
    if missing:
        return f"{where} is missing {', '.join(missing)}"
    if schema.get("additionalProperties") is False:
        extra = [key for key in value if key not in properties]
        if extra:
            return f"{where} has unexpected {', '.join(extra)}"
    for key, sub in properties.items():
        if key in value and isinstance(sub, dict) and (problem := _check(value[key], sub, f"{where}.{key}")):
            return problem
    return None


def _is_type(value: Any, name: str) -> bool:
    if name in ("number", "integer") and isinstance(value, bool):
        return False
    if name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES.get(name, (object,)))
