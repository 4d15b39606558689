"""Grammar-constrained sampling: one llguidance matcher per request, and its allowed-token mask.

A mask is a bitmask of int32 words, [rows, ceil(vocab / 32)], bit t of a row set where token t may
come next. The samplers set every other logit to -inf before penalties, filters and the draw
(`ops.apply_token_bitmask`; on the GPU the `apply_token_bitmask` kernel); the chosen token then
advances the row's matcher. Once the grammar is complete only end-of-generation tokens are allowed,
so the request ends on EOS with finish_reason "stop".

llguidance gets every token's bytes from our tokenizer's own byte table (`Tokenizer.token_bytes`,
the one the detokenizer uses), so byte-level BPE and SentencePiece with byte fallback work alike.
That view takes 1.4-3 s to build for a 262k vocabulary, all of it inside llguidance holding the
interpreter lock. Built on the engine thread at a model's first grammar request, it stalled every
running request for that long; it is now started on a worker thread when the engine is made (while
the model loads, before any request), built once per tokenizer and vocabulary width and shared by
every engine over that tokenizer. A request that arrives before it is ready waits for it.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import llguidance
import llguidance.numpy
import numpy as np

from app.engine.request import Request
from app.engine.text.grammar import GrammarSpec

log = logging.getLogger(__name__)


def mask_words(vocab_size: int) -> int:
    """int32 words in one row's bitmask."""
    return (vocab_size + 31) // 32


class GrammarMasks:
    """The matchers of the requests that have a grammar, keyed by request id.

    `vocab_size` is the logits' width, which may exceed the tokenizer's (padded embeddings): ids
    past the tokenizer's last token are never allowed."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.words = mask_words(vocab_size)
        self._view = tokenizer_view(tokenizer, vocab_size)
        self._executor = llguidance.LLExecutor()
        self._matchers: dict[str, llguidance.LLMatcher] = {}

    def start(self, request: Request) -> None:
        """Make the request's matcher (and replay its output so far, as after a preemption).
        ValueError when the grammar cannot be served with this vocabulary."""
        spec = request.sampling_params.grammar
        assert spec is not None, f"{request.request_id} has no grammar"
        matcher = self._matcher_for(spec)
        if request.output_token_ids and not matcher.consume_tokens(request.output_token_ids):
            raise ValueError(f"{request.request_id}: its output so far does not match its grammar")
        self._matchers[request.request_id] = matcher

    def forget(self, request_id: str) -> None:
        self._matchers.pop(request_id, None)

    def fill(self, requests: Sequence[Request], out: np.ndarray) -> None:
        """Row i of `out` (int32 [>= len(requests), words], C order) := the mask of requests[i]."""
        pairs = [(self._matcher(request), row) for row, request in enumerate(requests)]
        llguidance.numpy.fill_next_token_bitmask_par(self._executor, pairs, out)

    def masks(self, requests: Sequence[Request]) -> np.ndarray:
        """The masks of `requests`, int32 [len(requests), words]."""
        out = np.empty((len(requests), self.words), dtype=np.int32)
        self.fill(requests, out)
        return out

    def advance(self, requests: Sequence[Request], token_ids: Sequence[int]) -> None:
        """Each request's matcher takes the token sampled for it. A token the mask did not allow
        (only when every allowed logit was -inf) leaves the matcher in its error state, whose mask
        allows only EOS: the request then ends."""
        for request, token_id in zip(requests, token_ids, strict=True):
            matcher = self._matcher(request)
            if not matcher.consume_token(token_id):
                log.warning(
                    "%s: token %d breaks its grammar: %s", request.request_id, token_id, matcher.get_error()
                )

    def _matcher(self, request: Request) -> llguidance.LLMatcher:
        if request.request_id not in self._matchers:
            self.start(request)
        return self._matchers[request.request_id]

    def _matcher_for(self, spec: GrammarSpec) -> llguidance.LLMatcher:
        matcher = llguidance.LLMatcher(self._tokenizer_view(), spec.compiled, log_level=0)
        if matcher.is_error():
            raise ValueError(
                f"the grammar cannot be enforced with this model's vocabulary: {matcher.get_error()}"
            )
        return matcher

    def _tokenizer_view(self) -> llguidance.LLTokenizer:
        return self._view.result()


_VIEWS: weakref.WeakKeyDictionary[Any, dict[int, Future[llguidance.LLTokenizer]]] = weakref.WeakKeyDictionary()
_VIEWS_LOCK = threading.Lock()


def tokenizer_view(tokenizer: Any, vocab_size: int) -> Future[llguidance.LLTokenizer]:
    """llguidance's view of `tokenizer` at `vocab_size` logits, built once on its own thread."""
    with _VIEWS_LOCK:
        try:
            views = _VIEWS.setdefault(tokenizer, {})
        except TypeError:  # a tokenizer that cannot be weakly referenced or hashed: this engine's own view
            views = {}
        if vocab_size not in views:
            future: Future[llguidance.LLTokenizer] = Future()
            views[vocab_size] = future
            # not a daemon: the interpreter's exit waits for the build (seconds at most). A daemon thread still
            # inside llguidance at exit is torn down as it retakes the interpreter lock, and that forced unwind
            # through llguidance's Rust frames crashed the process (a script that made an engine and returned)
            threading.Thread(
                target=_build_view, args=(future, tokenizer, vocab_size), name="grammar-vocab", daemon=False
            ).start()
        return views[vocab_size]


def _build_view(future: Future[llguidance.LLTokenizer], tokenizer: Any, vocab_size: int) -> None:
    try:
        view = llguidance.LLTokenizer(
            llguidance.TokenizerWrapper(_TokenTable(tokenizer, vocab_size)),
            eos_token=sorted(tokenizer.eos_token_ids),
        )
    except BaseException as exc:  # handed to the request that needs the view
        future.set_exception(exc)
    else:
        future.set_result(view)


class _TokenTable:
    """What `llguidance.TokenizerWrapper` reads: every token's bytes, the special ids, an encoder.
    The table has one entry per logit: ids the tokenizer lacks are empty, which no grammar allows."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        eos_ids = sorted(tokenizer.eos_token_ids)
        self.eos_token_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else eos_ids[0]
        self.bos_token_id = tokenizer.bos_token_id
        known = min(vocab_size, tokenizer.vocab_size)
        self.tokens = [tokenizer.token_bytes(i) for i in range(known)] + [b""] * (vocab_size - known)
        self.special_token_ids = [i for i in range(known) if tokenizer.is_special(i)]
        self._tokenizer = tokenizer

    def __call__(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False, parse_special=False)
