"""A tool's parameters schema made ready for the call grammar (`tool_calls.calls_rule`).

- Objects that declare `properties` are closed to other keys (`closed`).
- Local references are re-pointed into the call (`rebased`): the parameters sit under the call's
  "arguments", so "#" would otherwise name the whole call and "#/$defs/x" a place that does not exist.
- A schema with no finite value (references that loop with no way out, as `{"$ref": "#"}` or a
  required property that refers back to its object) is found before sampling (`endless_reference`):
  llguidance compiles it, then its parser gives up mid-reply, and the request ended with a stray "<"
  and no call.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

# Where a tool's parameters sit in the call's schema (tool_calls._call_json).
ARGUMENTS_POINTER = "#/properties/arguments"
# Keywords whose values are data, not schemas: a "$ref" key inside them is not a reference.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_VALUES = ("items", "additionalProperties", "not", "if", "then", "else", "contains")


def closed(schema: Any) -> Any:
    """`schema` with every object that declares `properties` but says nothing of other keys closed
    to them, as OpenAI's strict mode and xgrammar's do: a tool has no use for arguments it never
    declared, and left open, a sampled call can grow keys until max_tokens cuts it off mid-JSON."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {key: closed(value) for key, value in schema.items()}
    if "properties" in schema and not {"additionalProperties", "patternProperties"} & schema.keys():
        result["additionalProperties"] = False
    if isinstance(schema.get("properties"), dict):  # property names are not schemas: keep them
        result["properties"] = {name: closed(value) for name, value in schema["properties"].items()}
    return result


def rebased(schema: Any) -> Any:
    """`schema` with every local `$ref` re-pointed into the call's "arguments"."""
    if isinstance(schema, list):
        return [rebased(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {key: value if key in _DATA_KEYWORDS else rebased(value) for key, value in schema.items()}
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        result["$ref"] = ARGUMENTS_POINTER + ref[1:]
    if isinstance(schema.get("properties"), dict):  # property names are not schemas: a "$ref" one stays
        result["properties"] = {name: rebased(value) for name, value in schema["properties"].items()}
    return result


def endless_reference(schema: Any) -> str | None:
    """None when `schema` has a finite JSON value; else the pointer ("#/properties/child") of a
    reference whose every value would have to contain itself.

    The least fixpoint of "this subschema can end": a reference ends where its target does, an object
    where its required properties do, an array where the items its minItems needs do, anyOf/oneOf where
    one branch does, allOf where all do. Constraints other than references are llguidance's to refuse."""
    nodes = dict(_subschemas(schema, ""))
    ends: set[str] = set()
    changed = True
    while changed:
        changed = False
        for pointer, node in nodes.items():
            if pointer not in ends and _can_end(node, pointer, ends, nodes):
                ends.add(pointer)
                changed = True
    if "" in ends:
        return None
    loops = [p for p, node in nodes.items() if p not in ends and isinstance(node, dict) and "$ref" in node]
    return "#" + (loops[0] if loops else "")


def _subschemas(schema: Any, pointer: str) -> Iterator[tuple[str, Any]]:
    yield pointer, schema
    if not isinstance(schema, dict):
        return
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            for name, value in schema[key].items():
                yield from _subschemas(value, f"{pointer}/{key}/{_escape(str(name))}")
    for key in _SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            for index, value in enumerate(schema[key]):
                yield from _subschemas(value, f"{pointer}/{key}/{index}")
    for key in _SCHEMA_VALUES:
        if isinstance(schema.get(key), dict | bool):
            yield from _subschemas(schema[key], f"{pointer}/{key}")
        elif key == "items" and isinstance(schema.get(key), list):  # draft 4's tuple form
            for index, value in enumerate(schema[key]):
                yield from _subschemas(value, f"{pointer}/items/{index}")


def _can_end(node: Any, pointer: str, ends: set[str], nodes: dict[str, Any]) -> bool:
    if isinstance(node, bool):
        return node
    if not isinstance(node, dict):
        return True
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        target = _unescape_uri(ref[1:])
        if target in nodes and target not in ends:
            return False
    if "allOf" in node and not _all(node, pointer, "allOf", ends):
        return False
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list) and node[key] and not _any(node, pointer, key, ends):
            return False
    properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
    for name in node.get("required") or []:
        if (
            isinstance(name, str)
            and name in properties
            and f"{pointer}/properties/{_escape(name)}" not in ends
        ):
            return False
    needed = node.get("minItems", 0)
    if isinstance(needed, int) and needed > 0:
        prefix = node.get("prefixItems") if isinstance(node.get("prefixItems"), list) else []
        for index in range(min(needed, len(prefix))):
            if f"{pointer}/prefixItems/{index}" not in ends:
                return False
        if (
            needed > len(prefix)
            and isinstance(node.get("items"), dict | bool)
            and f"{pointer}/items" not in ends
        ):
            return False
    return True


def _all(node: dict[str, Any], pointer: str, key: str, ends: set[str]) -> bool:
    return all(f"{pointer}/{key}/{i}" in ends for i in range(len(node[key])))


def _any(node: dict[str, Any], pointer: str, key: str, ends: set[str]) -> bool:
    return any(f"{pointer}/{key}/{i}" in ends for i in range(len(node[key])))


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _unescape_uri(pointer: str) -> str:
    """A "$ref" fragment as the pointer `_subschemas` writes: percent-escapes decoded, "~" kept."""
    return unquote(pointer)
