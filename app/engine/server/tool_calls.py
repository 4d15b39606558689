"""Tools in, tool calls out: which tools a request renders, and splitting calls from streamed text.

The template renders tools and parses calls (`ChatTemplate.parse_tool_calls`). While
streaming, text before a call is shown as it comes; once a call may have begun, the
rest is held and parsed when generation ends. Templates that name their call marker
(`tool_call_start`, e.g. "<tool_call>") get that incremental behaviour; for others,
all text is held while tools are enabled. `tool_choice` "required" or a named tool is
asked for in the system prompt: sampling is not constrained to a call.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

from app.engine.server.errors import bad_request

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolPlan:
    tools: list[dict[str, Any]] | None  # what the template renders
    parse_calls: bool
    instruction: str | None  # added to the system turn


def plan_tools(
    tools: list[dict[str, Any]] | None, choice: str | None, forced_name: str | None = None
) -> ToolPlan:
    """`choice` is "auto" | "none" | "required" | "named" (with `forced_name`); tools in OpenAI's shape."""
    if not tools or choice == "none":
        return ToolPlan(None, False, None)
    if choice == "required":
        return ToolPlan(tools, True, "You must answer by calling one of the provided tools.")
    if choice == "named":
        chosen = [tool for tool in tools if tool["function"]["name"] == forced_name]
        if not chosen:
            raise bad_request(
                f"tool_choice names {forced_name!r}, which is not among the tools.", param="tool_choice"
            )
        return ToolPlan(chosen, True, f"You must answer by calling the tool {forced_name}.")
    return ToolPlan(tools, True, None)


@dataclass(frozen=True)
class ParsedCall:
    id: str
    name: str
    arguments: str  # JSON text


class ToolCallSplitter:
    """Feed text deltas; get back the content that is safe to show now; `finish()` parses what was held."""

    def __init__(self, template: Any, enabled: bool) -> None:
        self._template = template
        self._enabled = enabled
        self._marker: str | None = getattr(template, "tool_call_start", None) if enabled else None
        self._text = ""
        self._emitted = 0
        self._holding = False

    def feed(self, delta: str) -> str:
        self._text += delta
        if not self._enabled:
            return self._take(len(self._text))
        if self._marker is None or self._holding:
            return ""
        start = self._text.find(self._marker, max(0, self._emitted - len(self._marker)))
        if start >= 0:
            self._holding = True
            return self._take(start)
        return self._take(len(self._text) - _partial_marker_length(self._text, self._marker))

    def finish(self) -> tuple[str, list[ParsedCall]]:
        """The content not yet shown, and the calls parsed from the whole text."""
        if not self._enabled:
            return self._take(len(self._text)), []
        content, calls = self._template.parse_tool_calls(self._text)
        parsed = [
            ParsedCall(call.id or f"call_{uuid.uuid4().hex[:24]}", call.name, call.arguments)
            for call in calls
        ]
        return _remainder(content, self._text[: self._emitted]), parsed

    def _take(self, end: int) -> str:
        out = self._text[self._emitted : end]
        self._emitted = max(self._emitted, end)
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
