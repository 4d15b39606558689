"""Recent chat prompts' ids, reused by a new prompt up to the last special token their texts share.

Agents send prompts that begin alike: several sessions (sub-agents, parallel tasks, every client of a
team's server) open with the same long system prompt and tool definitions, and a new conversation
repeats them whole. The prefix cache already keeps their KV; what is left is the host re-tokenizing
that text on every request: ~3 ms for 8,000 tokens on a slow core, ~10 ms at 30,000, all of it
before the engine sees the request (bench/lab/host_path.py profiles it). turn_memory.py covers the
next turn of one conversation (its text begins with the whole previous prompt); this covers prompts
that share only a start.

Why the ids can be spliced at a special token: the tokenizer first cuts the text at every special
token it spells, then normalizes, pre-tokenizes and tokenizes each piece on its own. So where two
texts agree up to and including a special token at character p, the ids before that token are the
same in both, and the new text's ids are the remembered ids before it followed by the ids of
text[p:] (tokenized from the special token on, so the piece after it is, as in the whole text, not
the text's first). Only special tokens for which that cut is certain serve (`Tokenizer.marker_text`:
no whole-word matching, none inside or extending another added token).

Bounded: `max_prompts` entries and `max_tokens` ids in all, least recently used dropped first;
thread-safe (prompts are built on worker threads).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from app.engine.server.turn_memory import NO_REUSE, Reuse

DEFAULT_PROMPTS = 16
# Ids kept as tuples (tuple.index is what finds the markers): ~36 bytes an id once the request that made them is
# gone, so 2^19 ids (16 prompts of 32k tokens) hold ~18 MiB at most.
DEFAULT_TOKENS = 2**19
MIN_SHARED_CHARS = 2048  # shorter shared starts tokenize in well under a millisecond: not worth a splice
PROBE_CHARS = 64  # a remembered prompt is compared further only if its first characters match


@dataclass
class _Remembered:
    text: str
    ids: tuple[int, ...]  # the prompt's ids, as the engine ran them
    # (index in ids, character position, length) of each marker token in order, found the first time a new
    # prompt shares this one's start (most remembered prompts never need them); () where text and ids disagree
    markers: tuple[tuple[int, int, int], ...] | None = None


class PromptPrefixes:
    """Recent prompts of one tokenizer (text and ids), and the longest safe reuse of their ids."""

    def __init__(
        self, tokenizer: Any, max_prompts: int = DEFAULT_PROMPTS, max_tokens: int = DEFAULT_TOKENS,
        min_chars: int = MIN_SHARED_CHARS,
    ) -> None:  # fmt: skip
        if max_prompts < 0 or max_tokens < 0:
            raise ValueError(f"max_prompts and max_tokens must not be negative, not {max_prompts}, {max_tokens}")
        self.tokenizer = tokenizer
        self.max_prompts, self.max_tokens, self.min_chars = max_prompts, max_tokens, min_chars
        self._prompts: OrderedDict[str, _Remembered] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._prompts)

    def remember(self, text: str, ids: list[int]) -> None:
        """Keep a prompt's text and ids (the ids must be the tokenizer's for that text, BOS included)."""
        if not self.max_prompts or len(ids) > self.max_tokens or len(text) < self.min_chars:
            return
        entry = _Remembered(text, tuple(ids))
        with self._lock:
            old = self._prompts.pop(text, None)
            if old is not None:
                self._tokens -= len(old.ids)
            self._prompts[text] = entry
            self._tokens += len(ids)
            while len(self._prompts) > self.max_prompts or self._tokens > self.max_tokens:
                _, dropped = self._prompts.popitem(last=False)
                self._tokens -= len(dropped.ids)

    def reuse(self, text: str) -> Reuse:
        """Ids for the start of `text` up to (not including) the last marker token it shares with a
        remembered prompt, and the characters they spell; tokenize text[num_chars:] for the rest."""
        with self._lock:
            candidates = [p for p in reversed(self._prompts.values()) if p.text[:PROBE_CHARS] == text[:PROBE_CHARS]]
        # Longest shared start first, among equals one whose markers are already found: the markers of the
        # others are looked for only while their shared start could still beat the best cut so far.
        shared_by = sorted(
            ((_common_prefix_length(p.text, text), p.markers is not None, p) for p in candidates),
            key=lambda entry: entry[:2], reverse=True,
        )  # fmt: skip
        best: tuple[int, _Remembered, int] | None = None  # (characters, prompt, ids kept)
        for shared, _, prompt in shared_by:
            if shared < self.min_chars or (best is not None and shared <= best[0]):
                break
            if prompt.markers is None:  # a benign race: two threads may both find the same positions
                prompt.markers = self._marker_positions(prompt.text, prompt.ids)
            cut = _last_marker_within(prompt.markers, shared)
            if cut is not None and (best is None or cut[1] > best[0]):
                best = (cut[1], prompt, cut[0])
        if best is None or best[0] < self.min_chars:
            return NO_REUSE
        chars, prompt, count = best
        with self._lock:
            if prompt.text in self._prompts:
                self._prompts.move_to_end(prompt.text)
        return Reuse(list(prompt.ids[:count]), chars)

    def _marker_positions(self, text: str, ids: tuple[int, ...]) -> tuple[tuple[int, int, int], ...]:
        """Where each marker token of `ids` starts in `text`; empty where the two do not agree on the
        markers (every spelling of a marker in the text must be that marker's id, in order)."""
        tokenizer = self.tokenizer
        present = {t: tokenizer.marker_text(t) for t in set(ids) & tokenizer.special_ids}
        markers = {t: m for t, m in present.items() if m is not None}
        # a BOS the tokenizer put before the text is no spelling of it
        bos = tokenizer.bos_token
        added_bos = bos is not None and ids[:1] == (tokenizer.bos_token_id,) and not text.startswith(bos)
        indices: list[int] = []
        for token, marker in markers.items():
            found = _indices_of(ids, token, 1 if added_bos and token == ids[0] else 0)
            if text.count(marker) != len(found):
                return ()
            indices += found
        indices.sort()
        positions, pos = [], 0
        for index in indices:
            marker = markers[ids[index]]
            pos = text.find(marker, pos)
            if pos < 0:
                return ()
            positions.append((index, pos, len(marker)))
            pos += len(marker)
        return tuple(positions)


def _indices_of(ids: tuple[int, ...], token: int, start: int) -> list[int]:
    """Where `token` is in ids[start:] (tuple.index scans at C speed: a marker is a few of 8,000 ids)."""
    found = []
    try:
        while True:
            start = ids.index(token, start)
            found.append(start)
            start += 1
    except ValueError:
        return found


def _common_prefix_length(a: str, b: str) -> int:
    """Characters `a` and `b` share from the start: a binary search of slice compares (each one C-speed)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _last_marker_within(markers: tuple[tuple[int, int, int], ...], shared: int) -> tuple[int, int] | None:
    """(index, position) of the last marker whose whole text lies in the first `shared` characters."""
    for index, pos, length in reversed(markers):
        if pos + length <= shared:
            return index, pos
    return None
