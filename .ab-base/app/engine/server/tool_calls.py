"""Tools in, tool calls out: which tools a request renders, and splitting calls from streamed text.

The template renders tools and parses calls (`ChatTemplate.parse_tool_calls`). While
streaming, text before a call is shown as it comes; once a call may have begun, the
rest is held and parsed when generation ends. Templates that name their call marker
(`tool_call_start`, e.g. "<tool_call>") get that incremental behaviour; for others,
all text is held while tools are enabled.

`tool_choice` "required" (Anthropic "any") or a named tool is enforced while sampling: the
plan's grammar admits only tool calls in the format the parser reads, `<tool_call>`-tagged
JSON where the template names that marker, else a bare JSON object, each call's arguments
held to its tool's JSON schema (unsupported schema keywords are ignored, not refused: agents
send large schemas). It is asked for in the system prompt too, which keeps the model's
choice of tool and arguments sensible.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from dataclasses import dataclass
from typing import Any

from app.engine import GrammarSpec, SamplingParams
from app.engine.server import tool_schemas as schemas
from app.engine.server.errors import bad_request
from app.engine.text.gemma4_reply import Gemma4Stream
from app.engine.text.harmony import CONTENT, HarmonyStream

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolPlan:
    tools: list[dict[str, Any]] | None  # what the template renders
    parse_calls: bool
    instruction: str | None  # added to the system turn
    calls_rule: str | None = None  # Lark rules whose `calls` is one or more calls to `tools`
    grammar: GrammarSpec | None = None  # set when the reply must be tool calls


def plan_tools(
    tools: list[dict[str, Any]] | None,
    choice: str | None,
    forced_name: str | None = None,
    *,
    call_marker: str | None = None,
    parallel: bool = True,
) -> ToolPlan:
    """`choice` is "auto" | "none" | "required" | "named" (with `forced_name`); tools in OpenAI's
    shape; `call_marker` the template's `tool_call_start`; `parallel`: more than one call allowed."""
    if not tools and choice in ("required", "named"):
        wanted = "a call" if choice == "required" else f"a call of {forced_name!r}"
        raise bad_request(
            f"tool_choice asks for {wanted}, but the request has no tools.", param="tool_choice"
        )
    if not tools or choice == "none":
        return ToolPlan(None, False, None)
    if choice == "named":
        chosen = [tool for tool in tools if tool["function"]["name"] == forced_name]
        if not chosen:
            raise bad_request(
                f"tool_choice names {forced_name!r}, which is not among the tools.", param="tool_choice"
            )
        rule = calls_rule(chosen, call_marker, parallel)
        instruction = f"You must answer by calling the tool {forced_name}."
        return ToolPlan(chosen, True, instruction, rule, _only(rule))
    rule = calls_rule(tools, call_marker, parallel)
    if choice == "required":
        instruction = "You must answer by calling one of the provided tools."
        return ToolPlan(tools, True, instruction, rule, _only(rule))
    return ToolPlan(tools, True, None, rule)


def _only(calls: str) -> GrammarSpec:
    return GrammarSpec.lark("start: calls\n" + calls)


def calls_rule(tools: list[dict[str, Any]], call_marker: str | None, parallel: bool) -> str:
    """Lark rules for tool calls as the parser (text/tool_calls.py) reads them back: with the
    "<tool_call>" marker, each call tagged on lines of its own as the built-in templates ask
    (several separated by a newline when `parallel`); otherwise one bare JSON object. A tool
    whose schema cannot be enforced is a 400 naming it."""
    for index, tool in enumerate(tools):
        loop = schemas.endless_reference(tool["function"].get("parameters") or {})
        if loop is not None:
            raise bad_request(
                f"tools[{index}] ({tool['function']['name']}): its parameters schema has no finite value: the "
                f"reference at '{loop}' loops back to itself with no way to end, so no call could be sampled.",
                param="tools",
            )
        try:
            GrammarSpec.lark("start: " + _call_json(tool))
        except ValueError as exc:
            reason = str(exc).splitlines()[0]  # the rest repeats the whole schema
            raise bad_request(
                f"tools[{index}] ({tool['function']['name']}): {reason}", param="tools"
            ) from exc
    rules = ["call_json: " + " | ".join(_call_json(tool) for tool in tools)]
    if call_marker == "<tool_call>":
        rules.append('call: "<tool_call>\\n" call_json "\\n</tool_call>"')
        rules.append('calls: call ("\\n" call)*' if parallel else "calls: call")
    else:
        rules.append("calls: call_json")
    return "\n".join(rules)


def _call_json(tool: dict[str, Any]) -> str:
    """A `%json` expression for one call of `tool`: its name, then arguments under its schema."""
    function = tool["function"]
    parameters = schemas.rebased(
        schemas.closed(function.get("parameters") or {"type": "object", "properties": {}})
    )
    schema = {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, "arguments": parameters},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }
    return GrammarSpec.lark_json(schema, {"lenient": True})


@dataclass(frozen=True)
class ParsedCall:
    id: str
    name: str
    arguments: str  # JSON text


class ToolCallSplitter:
    """Feed text deltas; get back the content that is safe to show now; `finish()` parses what was held.

    The whole text is kept as pieces (joined once, for the parser at the end), and the marker is looked for in a
    window: the text not yet shown and the marker's length before it. Kept as one string grown by `+=`, the
    text was copied whole at every token (quadratic in a long reply)."""

    def __init__(self, template: Any, enabled: bool) -> None:
        self._template = template
        self._enabled = enabled
        self._marker: str | None = getattr(template, "tool_call_start", None) if enabled else None
        self._pieces: list[str] = []
        self._length = 0
        self._emitted = 0
        self._window = ""  # the text from `_window_start` on
        self._window_start = 0
        self._holding = False

    def feed(self, delta: str) -> str:
        self._pieces.append(delta)
        self._length += len(delta)
        if not self._enabled:
            self._emitted = self._length
            return delta
        if self._marker is None or self._holding:
            return ""
        self._window += delta
        start = self._window.find(self._marker, max(0, self._emitted - len(self._marker) - self._window_start))
        if start >= 0:
            self._holding = True
            return self._take(self._window_start + start)
        return self._take(self._length - _partial_marker_length(self._window, self._marker))

    def finish(self) -> tuple[str, list[ParsedCall]]:
        """The content not yet shown, and the calls parsed from the whole text."""
        if not self._enabled:
            return "", []
        text = "".join(self._pieces)
        content, calls = self._template.parse_tool_calls(text)
        parsed = [
            ParsedCall(call.id or f"call_{uuid.uuid4().hex[:24]}", call.name, call.arguments)
            for call in calls
        ]
        return _remainder(content, text[: self._emitted]), parsed

    def _take(self, end: int) -> str:
        """The window's text from what was shown to `end`, now shown; the window keeps the marker's length of
        it (a marker may begin there)."""
        out = self._window[self._emitted - self._window_start : end - self._window_start]
        self._emitted = max(self._emitted, end)
        keep_from = max(0, self._emitted - len(self._marker or ""))
        if keep_from > self._window_start:
            self._window = self._window[keep_from - self._window_start :]
            self._window_start = keep_from
        return out


def _partial_marker_length(text: str, marker: str) -> int:
    """Length of the longest end of `text` that could be the start of `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


def _remainder(content: str, shown: str) -> str:
    if content.startswith(shown):
        return content[len(shown) :]
    if content.startswith(shown.strip()):
        return content[len(shown.strip()) :]
    log.debug("tool-call parser changed already streamed text; %r not a prefix of %r", shown, content)
    return ""


def split_calls(template: Any, text: str, enabled: bool) -> tuple[str, list[ParsedCall]]:
    """A finished text's content and tool calls (the non-streaming path: the parser's content as it is)."""
    if not enabled:
        return text, []
    content, calls = template.parse_tool_calls(text)
    return content, [_with_id(call) for call in calls]


def _with_id(call: Any) -> ParsedCall:
    return ParsedCall(call.id or f"call_{uuid.uuid4().hex[:24]}", call.name, call.arguments)


# -- replies in channels (GPT-OSS's harmony): reasoning apart from the answer -------------------


def is_channelled(template: Any) -> bool:
    """Whether replies come in channels parsed from their special tokens (GPT-OSS's harmony, Gemma 4)."""
    return getattr(template, "reply_format", None) in ("harmony", "gemma4")


def reply_params(template: Any, params: SamplingParams) -> SamplingParams:
    """A channelled reply is parsed from its special tokens, so they must be decoded as text."""
    return dataclasses.replace(params, skip_special_tokens=False) if is_channelled(template) else params


class ReplySplitter:
    """Feed text deltas; get `(kind, text)` pieces safe to show now, kind REASONING or CONTENT;
    `finish()` gives the rest and the tool calls. Templates without channels give only CONTENT,
    through `ToolCallSplitter`."""

    def __init__(self, template: Any, parse_calls: bool) -> None:
        self._parse_calls = parse_calls
        self._stream: HarmonyStream | Gemma4Stream | None = None
        if is_channelled(template):
            self._stream = Gemma4Stream() if template.reply_format == "gemma4" else HarmonyStream()
        self._splitter = ToolCallSplitter(template, parse_calls)

    def feed(self, delta: str) -> list[tuple[str, str]]:
        if self._stream is not None:
            return self._stream.feed(delta)
        text = self._splitter.feed(delta)
        return [(CONTENT, text)] if text else []

    def finish(self) -> tuple[list[tuple[str, str]], list[ParsedCall]]:
        if self._stream is not None:
            pieces = self._stream.finish()
            calls = [_with_id(c) for c in self._stream.reply.calls] if self._parse_calls else []
            return pieces, calls
        rest, calls = self._splitter.finish()
        return ([(CONTENT, rest)] if rest else []), calls


def split_reply(template: Any, text: str, enabled: bool) -> tuple[str, str, list[ParsedCall]]:
    """A finished text's reasoning, content and tool calls (reasoning only from channelled replies)."""
    if not is_channelled(template):
        content, calls = split_calls(template, text, enabled)
        return "", content, calls
    reply = template.parse_reply(text)
    return reply.reasoning, reply.content, [_with_id(c) for c in reply.calls] if enabled else []
