"""Gemma 4's reply format, parsed as it streams: reasoning, answer and tool calls apart.

A Gemma 4 reply may open with a thought channel, `<|channel>thought\\n ... <channel|>` (reasoning:
OpenAI's `reasoning_content`, Anthropic's `thinking`), and writes each tool call as
`<|tool_call>call:NAME{key:value,...}<tool_call|>`, where a string is wrapped in the `<|"|>` token,
keys are bare, numbers, booleans and null are bare, and objects and lists nest as `{k:v}` / `[v,...]`.
Everything else is the answer; Gemma's other special tokens (`<turn|>`, `<eos>`...) are dropped.

The markers are special tokens, so these replies are decoded with `skip_special_tokens=False` (as
harmony's). The stream holds back a tail that may be the start of a marker, and a tool call until it
closes; `finish()` closes an open channel or call (the engine stops on `<turn|>` without printing it).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from app.engine.text.harmony import CONTENT, REASONING, Reply
from app.engine.text.tool_calls import ToolCall

CHANNEL_OPEN, CHANNEL_CLOSE = "<|channel>", "<channel|>"
CALL_OPEN, CALL_CLOSE = "<|tool_call>", "<tool_call|>"
QUOTE = '<|"|>'
_MARKER = re.compile(r"<\|[a-z_]+>|<[a-z_]+\|>|<\|\"\|>|<(?:eos|bos|pad)>")
_PARTIAL = re.compile(r"<(\|[a-z_\"]*\|?|[a-z_]+\|?)?")
_CALL = re.compile(r"\s*call:\s*([A-Za-z_][\w.\-]*)\s*(\{.*\})\s*\Z", re.DOTALL)


class Gemma4Stream:
    """Feed decoded text as it arrives; get back (kind, text) pieces safe to show now."""

    def __init__(self) -> None:
        self._buffer = ""
        self._kind = CONTENT  # REASONING inside a thought channel
        self._call: str | None = None  # a tool call's text while one is open
        self._channel_name = False  # just after <|channel>: its name ("thought") comes next
        self.reply = Reply()

    def feed(self, delta: str) -> list[tuple[str, str]]:
        self._buffer += delta
        return self._drain(final=False)

    def finish(self) -> list[tuple[str, str]]:
        pieces = self._drain(final=True)
        if self._call is not None:
            self._close_call()
        self._kind = CONTENT
        return pieces

    def _drain(self, final: bool) -> list[tuple[str, str]]:
        pieces: list[tuple[str, str]] = []
        while self._buffer:
            if self._channel_name:  # `thought\n` after <|channel>: read the name, then the channel's text
                newline = self._buffer.find("\n")
                if newline < 0 and not final:
                    break
                name = self._take(len(self._buffer) if newline < 0 else newline + 1).strip()
                self._kind = REASONING if name in ("thought", "thinking", "analysis") else CONTENT
                self._channel_name = False
                continue
            match = _MARKER.search(self._buffer)
            if self._call is not None:  # inside a call: everything up to its close is the call
                at = self._buffer.find(CALL_CLOSE)
                if at < 0:
                    self._call += self._take(len(self._buffer) - (0 if final else _partial(self._buffer)))
                    break
                self._call += self._take(at)
                self._take(len(CALL_CLOSE))
                self._close_call()
                continue
            if match is None:
                keep = 0 if final else _partial(self._buffer)
                pieces.append(self._emit(self._take(len(self._buffer) - keep)))
                break
            pieces.append(self._emit(self._take(match.start())))
            marker = self._take(len(match.group()))
            if marker == CHANNEL_OPEN:
                self._channel_name = True
            elif marker == CHANNEL_CLOSE:
                self._kind = CONTENT
            elif marker == CALL_OPEN:
                self._call = ""
            # any other special token (<turn|>, <eos>, a stray quote) is not text
        return [p for p in pieces if p[1]]

    def _emit(self, text: str) -> tuple[str, str]:
        if self._kind == REASONING:
            self.reply.reasoning += text
        else:
            self.reply.content += text
        return self._kind, text

    def _close_call(self) -> None:
        call, self._call = self._call or "", None
        parsed = parse_call(call)
        if parsed is None:  # not a call after all: keep what the model wrote as the answer
            self.reply.content += call
            return
        name, arguments = parsed
        self.reply.calls.append(
            ToolCall(f"call_{uuid.uuid4().hex[:24]}", name, json.dumps(arguments, ensure_ascii=False))
        )

    def _take(self, n: int) -> str:
        out, self._buffer = self._buffer[:n], self._buffer[n:]
        return out


def _partial(text: str) -> int:
    """Length of the end of `text` that may be the start of a marker (`<`, `<|`, `<|tool_ca`, `<chan`...)."""
    at = text.rfind("<")
    if at < 0:
        return 0
    tail = text[at:]
    return len(tail) if _PARTIAL.fullmatch(tail) else 0


def parse_call(text: str) -> tuple[str, dict[str, Any]] | None:
    """`call:NAME{key:value,...}` -> (NAME, arguments), or None if it does not parse."""
    match = _CALL.match(text)
    if match is None:
        return None
    try:
        value, end = _Values(match.group(2)).value(0)
    except ValueError:
        return None
    if end != len(match.group(2)) or not isinstance(value, dict):
        return None
    return match.group(1), value


class _Values:
    """A recursive-descent reader of Gemma 4's argument values."""

    _BARE = re.compile(r"[^,\]\}]+")

    def __init__(self, text: str) -> None:
        self.text = text

    def value(self, at: int) -> tuple[Any, int]:
        at = self._space(at)
        text = self.text
        if text.startswith(QUOTE, at):
            end = text.find(QUOTE, at + len(QUOTE))
            if end < 0:
                raise ValueError("unclosed string")
            return text[at + len(QUOTE) : end], end + len(QUOTE)
        if text.startswith("{", at):
            return self._object(at + 1)
        if text.startswith("[", at):
            return self._list(at + 1)
        if text.startswith('"', at):  # a JSON string where the model wrote one
            decoded, end = json.JSONDecoder().raw_decode(text, at)
            return decoded, end
        bare = self._BARE.match(text, at)
        if bare is None:
            raise ValueError(f"no value at {at}")
        word = bare.group().strip()
        try:
            return json.loads(word), bare.end()  # numbers, true, false, null
        except ValueError:
            return word, bare.end()  # an unquoted word: its text

    def _object(self, at: int) -> tuple[dict[str, Any], int]:
        out: dict[str, Any] = {}
        at = self._space(at)
        if self.text.startswith("}", at):
            return out, at + 1
        while True:
            key, at = self._key(at)
            at = self._space(at)
            if not self.text.startswith(":", at):
                raise ValueError("a key without ':'")
            out[key], at = self.value(at + 1)
            at = self._space(at)
            if self.text.startswith("}", at):
                return out, at + 1
            if not self.text.startswith(",", at):
                raise ValueError("expected ',' or '}'")
            at += 1

    def _list(self, at: int) -> tuple[list[Any], int]:
        out: list[Any] = []
        at = self._space(at)
        if self.text.startswith("]", at):
            return out, at + 1
        while True:
            item, at = self.value(at)
            out.append(item)
            at = self._space(at)
            if self.text.startswith("]", at):
                return out, at + 1
            if not self.text.startswith(",", at):
                raise ValueError("expected ',' or ']'")
            at += 1

    def _key(self, at: int) -> tuple[str, int]:
        at = self._space(at)
        if self.text.startswith(QUOTE, at) or self.text.startswith('"', at):
            key, at = self.value(at)
            return str(key), at
        match = re.compile(r"[^:\s]+").match(self.text, at)
        if match is None:
            raise ValueError("no key")
        return match.group(), match.end()

    def _space(self, at: int) -> int:
        while at < len(self.text) and self.text[at].isspace():
            at += 1
        return at


def parse_reply(text: str) -> Reply:
    stream = Gemma4Stream()
    stream.feed(text)
    stream.finish()
    return stream.reply
