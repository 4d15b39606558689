"""Lines a client changes on every request and the model does not need, kept out of the prompt.

The prefix cache is keyed by token ids, so one token that differs near the start of a prompt makes
everything after it a miss. Claude Code (2.1.36 and later) writes a billing line first in the
system prompt of every request it sends:

    x-anthropic-billing-header: cc_version=2.1.197.404; cc_entrypoint=cli; cch=1f0a3;

The version's three-hex suffix follows the first user message (in a recorded session it stayed the
same through the conversation and was another in each title request Claude Code sends beside a
turn), and `cch`, where it is sent, is a hash of the request body, new on every request: without
this such a request reads about 30 tokens from the cache and prefills the rest of a 10-60k-token
prompt again. The line is Anthropic's accounting of which client sent the request, not
an instruction: vLLM (PR 36829), Ollama (14918) and vllm-mlx drop it before templating too.

What is done, exactly: in the content of every system message (Anthropic's `system` blocks and
`system` turns, OpenAI's system and developer messages, after they became the neutral messages of
prompting.py), each line that begins with `x-anthropic-billing-header:` is removed with its line
break; a system message left with nothing but white space is removed. Nothing else in the prompt
changes. The rest of what Claude Code sends was checked in a recorded session
(tests/fixtures/claude_code/README.md): its `<system-reminder>` texts are sent again unchanged in
every later request, so they do not break the prefix; the "Output token limit hit. Resume
directly ..." message it sends after a cut answer is dropped from the history in later turns, which
does, but the model needs it in the request that carries it, so it stays.
ServerSettings.strip_volatile_metadata (`paddock serve --keep-volatile-metadata`) turns this off.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# (what the line is, the pattern of the whole line with its line break); a table, so a client's
# next such line is one row
VOLATILE_LINES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("Claude Code billing header", re.compile(r"^x-anthropic-billing-header:[^\n]*(?:\n|$)", re.MULTILINE)),
)


@dataclass(frozen=True)
class Stripped:
    """Messages without their volatile lines, and the lines removed (for the log)."""

    messages: list[dict[str, Any]]
    removed: tuple[str, ...]


def strip_volatile(messages: list[dict[str, Any]]) -> Stripped:
    """`messages` (the neutral template messages) without volatile lines in system content; the
    given list and its dicts are left as they are."""
    result: list[dict[str, Any]] = []
    removed: list[str] = []
    for message in messages:
        content = message.get("content")
        if message.get("role") != "system" or not isinstance(content, str):
            result.append(message)
            continue
        for _, pattern in VOLATILE_LINES:
            removed += [line.rstrip("\n") for line in pattern.findall(content)]
            content = pattern.sub("", content)
        if content == message["content"]:
            result.append(message)
        elif content.strip():
            result.append(dict(message, content=content))
    return Stripped(result, tuple(removed))
