"""GPT-OSS prompts in the harmony format, for checkpoints that carry no chat template of their own.

Follows the published harmony conventions (the layout openai-harmony renders): a system message
with the model identity, knowledge cutoff, reasoning effort and the valid channels; a developer
message with the caller's instructions and the tools as a TypeScript-like `namespace functions`;
then the turns. Earlier assistant answers go to the final channel, their tool calls to commentary
addressed `to=functions.NAME` with `<|constrain|>json`, tool results come back from
`functions.NAME to=assistant`. Earlier reasoning is dropped, as the format asks.
"""

from __future__ import annotations

import json
from typing import Any

from app.engine.text import harmony
from app.engine.text.harmony import CALL, CHANNEL, CONSTRAIN, END, MESSAGE, START

IDENTITY = "You are ChatGPT, a large language model trained by OpenAI."
KNOWLEDGE_CUTOFF = "2024-06"
EFFORTS = ("low", "medium", "high")


def render(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    reasoning_effort: str = "medium",
    current_date: str | None = None,
) -> str:
    """The prompt text (special tokens written out) for OpenAI-shaped messages and tools."""
    if reasoning_effort not in EFFORTS:
        raise ValueError(f"reasoning_effort must be one of {', '.join(EFFORTS)}, not {reasoning_effort!r}")
    instructions = [m for m in messages if m["role"] in ("system", "developer")]
    out = [_system(reasoning_effort, current_date, bool(tools))]
    developer = _developer("\n\n".join(_text(m) for m in instructions), tools)
    if developer:
        out.append(_message("developer", developer))
    names: dict[str, str] = {}  # tool_call_id -> function name, for the results that follow
    for message in messages:
        role = message["role"]
        if role in ("system", "developer"):
            continue
        if role == "user":
            out.append(_message("user", _text(message)))
        elif role == "assistant":
            out.extend(_assistant(message, names))
        elif role == "tool":
            name = message.get("name") or names.get(message.get("tool_call_id") or "", "tool")
            out.append(
                f"{START}functions.{name} to=assistant{CHANNEL}commentary{MESSAGE}{_text(message)}{END}"
            )
        else:
            raise ValueError(f"unknown role {role!r}")
    if add_generation_prompt:
        out.append(f"{START}assistant")
    return "".join(out)


def _system(effort: str, date: str | None, has_tools: bool) -> str:
    lines = [IDENTITY, f"Knowledge cutoff: {KNOWLEDGE_CUTOFF}"]
    if date:
        lines.append(f"Current date: {date}")
    lines += ["", f"Reasoning: {effort}", "", "# Valid channels: analysis, commentary, final. "
              "Channel must be included for every message."]  # fmt: skip
    if has_tools:
        lines.append("Calls to these tools must go to the commentary channel: 'functions'.")
    return _message("system", "\n".join(lines))


def _developer(instructions: str, tools: list[dict[str, Any]] | None) -> str:
    parts = []
    if instructions:
        parts.append(f"# Instructions\n\n{instructions}")
    if tools:
        parts.append("# Tools\n\n## functions\n\nnamespace functions {\n\n"
                     + "".join(_tool(t["function"]) for t in tools) + "} // namespace functions")  # fmt: skip
    return "\n\n".join(parts)


def _tool(function: dict[str, Any]) -> str:
    head = f"// {function['description']}\n" if function.get("description") else ""
    params = function.get("parameters") or {}
    if not params.get("properties"):
        return f"{head}type {function['name']} = () => any;\n\n"
    return f"{head}type {function['name']} = (_: {_object(params, 0)}) => any;\n\n"


def _object(schema: dict[str, Any], depth: int) -> str:
    required = set(schema.get("required") or ())
    lines = ["{"]
    for name, prop in (schema.get("properties") or {}).items():
        if prop.get("description"):
            lines.append(f"// {prop['description']}")
        value = prop.get("default")
        default = (
            ""
            if "default" not in prop
            else f" // default: {value if isinstance(value, str) else json.dumps(value)}"
        )
        optional = "" if name in required else "?"
        lines.append(f"{name}{optional}: {_type(prop, depth + 1)},{default}")
    lines.append("}")
    return "\n".join(lines)


def _type(schema: dict[str, Any], depth: int) -> str:
    if "enum" in schema:
        return " | ".join(json.dumps(v) for v in schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(_type({**schema, "type": k}, depth) for k in kind)
    if kind == "array":
        return f"{_type(schema.get('items') or {}, depth)}[]"
    if kind == "object":
        return _object(schema, depth) if schema.get("properties") and depth < 4 else "object"
    return {"string": "string", "integer": "number", "number": "number", "boolean": "boolean",
            "null": "null"}.get(kind or "", "any")  # fmt: skip


def _assistant(message: dict[str, Any], names: dict[str, str]) -> list[str]:
    out = []
    if _text(message):
        out.append(f"{START}assistant{CHANNEL}final{MESSAGE}{_text(message)}{END}")
    for call in message.get("tool_calls") or []:
        function = call.get("function", call)
        names[call.get("id") or ""] = function["name"]
        arguments = function.get("arguments")
        body = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        out.append(f"{START}assistant{CHANNEL}commentary to=functions.{function['name']} "
                   f"{CONSTRAIN}json{MESSAGE}{body}{CALL}")  # fmt: skip
    return out


def _message(role: str, text: str) -> str:
    return f"{START}{role}{MESSAGE}{text}{END}"


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


class HarmonyTemplate:
    """The built-in GPT-OSS template, with the interface of `chat_template.ChatTemplate`."""

    source = "builtin:harmony"
    reply_format = "harmony"
    tool_call_start = None
    stop_strings = (harmony.RETURN, harmony.CALL)

    def __init__(self) -> None:
        self.refused: str | None = None

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        return render(messages, tools, add_generation_prompt, **_known(extra))

    def render_within(
        self,
        limits: Any,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        extra: dict[str, Any] | None = None,
    ) -> str:
        """As `render`: plain Python, linear in the conversation, so no limits to apply."""
        return render(messages, tools, add_generation_prompt, **_known(extra or {}))

    def probe(self) -> None:
        """Nothing to bound: the renderer is plain Python, linear in the conversation."""

    def parse_tool_calls(self, text: str) -> tuple[str, list[Any]]:
        reply = harmony.parse_reply(text)
        return reply.content, reply.calls

    def parse_reply(self, text: str) -> harmony.Reply:
        return harmony.parse_reply(text)


def _known(extra: dict[str, Any]) -> dict[str, Any]:
    """chat_template_kwargs the renderer takes (others are for Jinja templates and are ignored)."""
    return {k: extra[k] for k in ("reasoning_effort", "current_date") if k in extra}
