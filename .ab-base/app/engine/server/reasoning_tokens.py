"""How many of a reply's tokens the model spent reasoning, for the usage every protocol reports.

Only replies whose reasoning this server separates from the answer have any: GPT-OSS's harmony
format, where each analysis-channel message is reasoning (`reasoning_content`, a `reasoning`
item, a `thinking` block). All the tokens of such a message count: the `<|start|>assistant` that
opens it when the model wrote one, its header, its body and the `<|end|>` that closes it, as
Anthropic defines thinking tokens ("including the thinking-block delimiter tokens"); an analysis
message cut short by max_tokens counts up to where it stopped. The completion/output token count
still counts every token. A Qwen3-style `<think>` block is not split from the content by this
server (it stays in the answer's text), so it counts 0 here, as the reply shows it.

The count is over token ids: harmony's markers are single special tokens, so only a message's
header (a few tokens) is decoded, to read its channel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from app.engine.server.tool_calls import is_channelled
from app.engine.text import gemma4_reply, harmony


class _Markers(NamedTuple):
    message: int
    closers: frozenset[int]


def count_reasoning_tokens(template: Any, tokenizer: Any, token_ids: Sequence[int]) -> int:
    """The reasoning tokens among a reply's generated `token_ids` (0 for a reply without channels)."""
    if getattr(template, "reply_format", None) == "gemma4":
        return _gemma4_reasoning_tokens(tokenizer, token_ids)
    markers = _markers(tokenizer) if is_channelled(template) else None
    if markers is None:
        return 0
    total, in_message, header, kind = 0, 0, [], None
    reading_header = True
    for token in token_ids:
        in_message += 1
        if reading_header:
            if token == markers.message:
                text = tokenizer.decode(header, skip_special_tokens=False).replace(harmony.START, "")
                kind, reading_header = harmony.parse_header(text).kind, False
            elif token in markers.closers:  # closed before its body began: nothing was said in it
                in_message, header = 0, []
            else:
                header.append(token)
            continue
        if token in markers.closers:
            total += in_message if kind == harmony.REASONING else 0
            in_message, header, kind, reading_header = 0, [], None, True
    if not reading_header and kind == harmony.REASONING:
        total += in_message  # the reply stopped inside an analysis message
    return total


def _gemma4_reasoning_tokens(tokenizer: Any, token_ids: Sequence[int]) -> int:
    """Gemma 4: the tokens of each thought channel, `<|channel>` and `<channel|>` included (one cut short
    by max_tokens counts up to where it stopped); the channel's name is read from the tokens after it."""
    opener, closer = (tokenizer.token_to_id(t) for t in (gemma4_reply.CHANNEL_OPEN, gemma4_reply.CHANNEL_CLOSE))
    if opener is None or closer is None:
        return 0
    total, start = 0, None
    for i, token in enumerate(token_ids):
        if token == opener and start is None:
            start = i
        elif token == closer and start is not None:
            total += _thought(tokenizer, token_ids[start : i + 1])
            start = None
    if start is not None:
        total += _thought(tokenizer, token_ids[start:])
    return total


def _thought(tokenizer: Any, channel: Sequence[int]) -> int:
    name = tokenizer.decode(list(channel[1:12]), skip_special_tokens=False).lstrip().split("\n")[0]
    return len(channel) if name.strip().startswith(("thought", "thinking", "analysis")) else 0


def _markers(tokenizer: Any) -> _Markers | None:
    """The ids of harmony's `<|message|>` and closing tokens; None if the vocabulary lacks them."""
    ids = [tokenizer.token_to_id(t) for t in (harmony.MESSAGE, harmony.END, harmony.RETURN, harmony.CALL)]
    if any(i is None for i in ids):
        return None
    return _Markers(ids[0], frozenset(ids[1:]))
