"""The harmony reply format of GPT-OSS, parsed as it streams: reasoning, answer and tool calls apart.

A reply is a run of messages, each `<|start|>{role}{header}<|message|>{body}` closed by `<|end|>`,
`<|return|>` (the last answer) or `<|call|>` (a tool call); the generation prompt already wrote
the first `<|start|>assistant`. The header names the channel (`<|channel|>analysis`, `commentary`,
`final`) and, for a tool call, the recipient (`to=functions.get_weather`, before or after the
channel) and the content type (`<|constrain|>json`). Here:

- the analysis channel is reasoning (OpenAI's `reasoning_content`, Anthropic's `thinking`);
- final, and commentary without a recipient (a preamble to the user), are the answer;
- a message to `functions.NAME` is a tool call whose arguments are its body.

The special tokens must reach the parser as text: harmony replies are decoded with
`skip_special_tokens=False`. The closing token of the last message may be missing (the engine
stops on it without printing it), so an open message is closed by `finish()`.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from app.engine.text.tool_calls import ToolCall

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
RETURN, CALL, CONSTRAIN = "<|return|>", "<|call|>", "<|constrain|>"
_CLOSERS = (END, RETURN, CALL)
_SPECIAL = re.compile(r"<\|[a-z_]+\|>")
REASONING, CONTENT = "reasoning", "content"


@dataclass
class Reply:
    """One parsed reply: the reasoning and the answer as text, and the tool calls."""

    reasoning: str = ""
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)


@dataclass(frozen=True)
class Header:
    role: str
    channel: str | None
    recipient: str | None

    @property
    def kind(self) -> str | None:
        """REASONING, CONTENT, or None for a tool call (held until its message closes)."""
        if self.recipient is not None and self.recipient != "user":
            return None
        return REASONING if self.channel == "analysis" else CONTENT


def parse_header(text: str) -> Header:
    """`assistant<|channel|>commentary to=functions.f <|constrain|>json` -> its parts."""
    role_part, _, channel_part = text.partition(CHANNEL)
    words = " ".join(_SPECIAL.sub(" ", f"{role_part} {channel_part}").split()).split(" ")
    recipient = next((w.removeprefix("to=") for w in words if w.startswith("to=")), None)
    plain = [w for w in words if w and not w.startswith("to=")]
    role = plain[0] if role_part.strip() and plain else "assistant"
    channel = None
    if CHANNEL in text:
        channel_words = [w for w in " ".join(_SPECIAL.sub(" ", channel_part).split()).split(" ") if w]
        channel = next((w for w in channel_words if not w.startswith("to=")), None)
    return Header(role, channel, recipient)


class HarmonyStream:
    """Feed decoded text as it arrives; get back (kind, text) pieces safe to show now."""

    def __init__(self) -> None:
        self._buffer = ""  # text not yet consumed: a header, or a body's end that may begin a special token
        self._header: str | None = ""  # "" while reading a header; None once in the message's body
        self._current: Header | None = None
        self._body = ""  # a held tool call's body
        self.reply = Reply()

    def feed(self, delta: str) -> list[tuple[str, str]]:
        self._buffer += delta
        return self._drain(final=False)

    def finish(self) -> list[tuple[str, str]]:
        """The rest, with an open message closed; `reply` then holds the whole reply."""
        pieces = self._drain(final=True)
        if self._header is None:
            self._close()
        elif self._buffer.strip() and not _SPECIAL.search(self._buffer):
            pieces.append(self._emit(CONTENT, self._buffer))  # no header at all: plain text is the answer
        self._header, self._buffer = "", ""
        return [p for p in pieces if p[1]]

    def _drain(self, final: bool) -> list[tuple[str, str]]:
        pieces: list[tuple[str, str]] = []
        while self._buffer:
            if self._header is not None:  # in a header: the buffer holds it until <|message|> comes
                at = self._buffer.find(MESSAGE)
                if at < 0:
                    break
                self._current = parse_header(self._take(at).replace(START, ""))
                self._take(len(MESSAGE))
                self._header = None
                continue
            closer = min(((self._buffer.find(c), c) for c in _CLOSERS if c in self._buffer), default=None)
            if closer is None:
                keep = 0 if final else _partial_special(self._buffer)
                pieces.append(self._body_text(self._take(len(self._buffer) - keep)))
                break
            at, token = closer
            pieces.append(self._body_text(self._take(at)))
            self._take(len(token))
            self._close()
            self._header = ""
        return [p for p in pieces if p[1]]

    def _body_text(self, text: str) -> tuple[str, str]:
        kind = self._current.kind if self._current else CONTENT
        if kind is None:
            self._body += text
            return CONTENT, ""
        return self._emit(kind, text)

    def _emit(self, kind: str, text: str) -> tuple[str, str]:
        if kind == REASONING:
            self.reply.reasoning += text
        else:
            self.reply.content += text
        return kind, text

    def _close(self) -> None:
        header, self._current = self._current, None
        if header is not None and header.kind is None:
            name = header.recipient.removeprefix("functions.") if header.recipient else ""
            self.reply.calls.append(ToolCall(f"call_{uuid.uuid4().hex[:24]}", name, _arguments(self._body)))
        self._body = ""

    def _take(self, n: int) -> str:
        out, self._buffer = self._buffer[:n], self._buffer[n:]
        return out


def _arguments(body: str) -> str:
    """The call's body as JSON text; a body that is not JSON is passed on as a JSON string."""
    body = body.strip()
    try:
        json.loads(body)
        return body
    except ValueError:
        return json.dumps(body)


def _partial_special(text: str) -> int:
    """Length of the end of `text` that may be the start of a special token (`<`, `<|`, `<|end`...)."""
    at = text.rfind("<")
    if at < 0:
        return 0
    tail = text[at:]
    return len(tail) if re.fullmatch(r"<(\|[a-z_]*\|?)?", tail) else 0


def parse_reply(text: str) -> Reply:
    stream = HarmonyStream()
    stream.feed(text)
    stream.finish()
    return stream.reply
