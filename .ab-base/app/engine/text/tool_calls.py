"""Tool calls parsed back out of a model's reply text, in the shapes the families write them."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text


_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)
_FENCED = re.compile(r"```(?:json)?\s*\n?(.*?)\n?\s*```", re.DOTALL)
# Qwen3-Coder / Qwen3-Next / Qwen3.5 write a call as XML inside the tags, one element per argument:
# <tool_call>\n<function=name>\n<parameter=key>\nvalue\n</parameter>\n</function>\n</tool_call>
_FUNCTION = re.compile(r"^<function=([^>\s]+)>(.*?)(?:</function>\s*|\Z)$", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\s]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """Recognises `<tool_call>{json}</tool_call>` (Hermes/Qwen) or `<tool_call><function=...>` (Qwen3.5's
    XML arguments), a bare JSON object or list
    (Llama 3: `{"name": ..., "parameters": ...}`, optionally after `<|python_tag|>`), and
    fenced ```json blocks holding name/arguments."""
    for pattern in (_TAGGED, _FENCED):
        calls, kept, position = [], [], 0
        for match in pattern.finditer(text):
            found = _calls_from_json(match.group(1)) or _call_from_xml(match.group(1))
            if found:
                calls += found
                kept.append(text[position : match.start()])
                position = match.end()
        if calls:
            return "".join([*kept, text[position:]]).strip(), calls
    bare = text.strip().removeprefix("<|python_tag|>").strip()
    if bare.startswith(("{", "[")):
        found = _calls_from_json(bare)
        if found:
            return "", found
    return text, []


def _calls_from_json(body: str) -> list[ToolCall]:
    try:
        data = json.loads(body)
    except ValueError:
        return []
    items = data if isinstance(data, list) else [data]
    calls = [_call_from_object(item) for item in items]
    return [call for call in calls if call is not None] if all(calls) else []


def _call_from_object(item: Any) -> ToolCall | None:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    arguments = item.get("arguments", item.get("parameters", {}))
    if isinstance(arguments, str):  # already JSON text: keep it if it parses
        try:
            json.loads(arguments)
        except ValueError:
            return None
    else:
        arguments = json.dumps(arguments, ensure_ascii=False)
    return ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", name=item["name"], arguments=arguments)


def _call_from_xml(body: str) -> list[ToolCall]:
    """`<function=name><parameter=key>value</parameter>...</function>`: each value is JSON where it
    parses as JSON other than a bare string (numbers, booleans, objects, lists), else the text itself
    (the element carries no types; the model writes non-string arguments as JSON)."""
    function = _FUNCTION.match(body.strip())
    if function is None:
        return []
    arguments = {}
    for key, raw in _PARAMETER.findall(function.group(2)):
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        arguments[key] = raw if isinstance(value, str) else value
    return [
        ToolCall(
            id=f"call_{uuid.uuid4().hex[:24]}",
            name=function.group(1),
            arguments=json.dumps(arguments, ensure_ascii=False),
        )
    ]
