"""The sampled ids of recent answers, reused in the next turn's prompt ids where its text repeats them.

An agent's next turn re-sends the whole conversation, the previous answer as text. The tokenizer
often spells that text with other ids than the model sampled ("▁post" "paid" sampled, "▁postpaid"
re-tokenized; always with random weights, often at temperature 1), and the prefix cache, keyed by
ids, then misses from there on: every turn re-prefills every earlier answer. So the server keeps,
for its last chat requests, the prompt text, the prompt ids and the sampled ids; a new prompt whose
text begins with a remembered prompt's text, then the bytes of the first k sampled tokens, takes
those ids as they were and tokenizes only the rest. llama.cpp's server keeps a slot's tokens and
reuses their longest common prefix with the re-tokenized prompt; this goes one step further and
keeps the ids the text came from.

Safe by construction: ids are reused only where the text they spell is, byte for byte, the text at
the same place in the new prompt; a sampled token ending inside a UTF-8 character, or an answer
whose plain text spells a special token's name (which re-tokenizing would read as that token), is
not reused. The match does not depend on who sends the prompt: an exact text match is a valid
spelling of that text whoever sent it, and sessions keyed by connection (sessions.py) change
whenever a client's pool opens a new one. Bounded: `max_turns` entries and `max_tokens` ids in all,
least recently used dropped first.
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_TURNS = 64
DEFAULT_TOKENS = 2**21  # 8 MiB of ids (and about as much text): 64 turns of a 32k-token agent context


@dataclass(frozen=True)
class _Turn:
    prompt_text: str
    prompt_ids: array  # 'l': the ids the engine ran for `prompt_text`
    output_ids: array  # 'l': the ids it sampled after them


@dataclass(frozen=True)
class Reuse:
    """Ids to put first in a prompt, and how many characters of its text they spell (0: none)."""

    token_ids: list[int]
    num_chars: int


NO_REUSE = Reuse([], 0)


class TurnMemory:
    """Recent (prompt text, prompt ids, sampled ids) of one tokenizer; thread-safe (prompts are
    built on worker threads, answers remembered on the event loop)."""

    def __init__(
        self, tokenizer: Any, max_turns: int = DEFAULT_TURNS, max_tokens: int = DEFAULT_TOKENS
    ) -> None:
        if max_turns < 0 or max_tokens < 0:
            raise ValueError(f"max_turns and max_tokens must not be negative, not {max_turns}, {max_tokens}")
        self.tokenizer = tokenizer
        self.max_turns, self.max_tokens = max_turns, max_tokens
        self._turns: OrderedDict[int, _Turn] = OrderedDict()
        self._tokens = 0
        self._next = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._turns)

    def remember(self, prompt_text: str, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> None:
        """Keep a finished request's prompt and sampled ids (the oldest go past the bounds)."""
        size = len(prompt_ids) + len(output_ids)
        if not self.max_turns or size > self.max_tokens or not output_ids or not prompt_text:
            return
        turn = _Turn(prompt_text, array("l", prompt_ids), array("l", output_ids))
        with self._lock:
            self._turns[self._next] = turn
            self._next += 1
            self._tokens += size
            while len(self._turns) > self.max_turns or self._tokens > self.max_tokens:
                _, old = self._turns.popitem(last=False)
                self._tokens -= len(old.prompt_ids) + len(old.output_ids)

    def reuse(self, text: str) -> Reuse:
        """The longest run of remembered ids that spells the start of `text` (NO_REUSE if none)."""
        with self._lock:
            candidates = [
                (key, t) for key, t in reversed(self._turns.items()) if text.startswith(t.prompt_text)
            ]
        best: tuple[int, int, _Turn, int] | None = None  # (characters, key, turn, sampled ids kept)
        for key, turn in candidates:  # most recent first: it wins a tie
            count, chars = self._output_prefix(turn.output_ids, text, len(turn.prompt_text))
            if best is None or len(turn.prompt_text) + chars > best[0]:
                best = (len(turn.prompt_text) + chars, key, turn, count)
        if best is None:
            return NO_REUSE
        chars, key, turn, count = best
        if count and not self._same_specials(turn, count, text[len(turn.prompt_text) : chars]):
            chars, count = len(turn.prompt_text), 0
        with self._lock:
            if key in self._turns:
                self._turns.move_to_end(key)
        return Reuse([*turn.prompt_ids, *turn.output_ids[:count]], chars)

    def _output_prefix(self, output_ids: array, text: str, start: int) -> tuple[int, int]:
        """(k, characters): the first k sampled tokens spell the next characters of `text` from `start`."""
        want = text[start:].encode("utf-8")
        ends, pos = [0], 0  # ends[k]: the bytes the first k tokens spell
        for token_id in output_ids:  # stops at the first mismatch: a foreign candidate costs a token or two
            piece = self.tokenizer.token_bytes(token_id)
            if want[pos : pos + len(piece)] != piece:
                break
            pos += len(piece)
            ends.append(pos)
        count = len(ends) - 1
        while count and ends[count] < len(want) and want[ends[count]] & 0xC0 == 0x80:
            count -= 1  # the kept ids would end inside a character: the rest starts at a whole one
        return count, len(want[: ends[count]].decode("utf-8"))

    def _same_specials(self, turn: _Turn, count: int, span: str) -> bool:
        """Whether `span` re-tokenized has the special tokens that the first `count` sampled ids have,
        in order: plain pieces that spell `<end_of_turn>` are text to the model, not the end of a turn."""
        tokenizer = self.tokenizer
        sampled = [i for i in turn.output_ids[:count] if tokenizer.is_special(i)]
        again = [
            i
            for i in tokenizer.encode(span, add_special_tokens=False, parse_special=True)
            if tokenizer.is_special(i)
        ]
        return sampled == again
