"""Engine logprobs in the shapes OpenAI's chat, completions and Responses APIs use."""

from __future__ import annotations

from typing import Any

from app.engine import TokenLogprob
from app.engine.server.protocol.chat import TokenLogprobInfo, TopLogprob
from app.engine.server.protocol.completions import CompletionLogprobs


class TokenTexts:
    """Token id -> the text it stands for, cached (decoding one token at a time is the hot path)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._cache[token_id] = self._decode(token_id)
        return text

    def _decode(self, token_id: int) -> str:
        # A streaming detokenizer keeps a SentencePiece piece's leading space, which decode() of a
        # lone token drops; "Hello" and " Hello" are different tokens and clients see the difference.
        make = getattr(self._tokenizer, "detokenizer", None)
        if make is not None:
            try:
                stream = make(skip_special_tokens=False)
                return stream.add([token_id]) + stream.flush()
            except ValueError:
                pass
        return self._tokenizer.decode([token_id], skip_special_tokens=False)


def chat_logprobs(texts: TokenTexts, logprobs: list[TokenLogprob], top_n: int) -> list[TokenLogprobInfo]:
    return [
        TokenLogprobInfo(
            token=texts(lp.token_id),
            logprob=lp.logprob,
            bytes=list(texts(lp.token_id).encode()),
            top_logprobs=[
                TopLogprob(token=texts(i), logprob=v, bytes=list(texts(i).encode()))
                for i, v in lp.top[:top_n]
            ],
        )
        for lp in logprobs
    ]


def completion_logprobs(
    texts: TokenTexts, logprobs: list[TokenLogprob], top_n: int, offset: int
) -> CompletionLogprobs:
    """`offset` is where these tokens' text starts in the choice's text (for text_offset)."""
    result = CompletionLogprobs()
    for lp in logprobs:
        token = texts(lp.token_id)
        result.tokens.append(token)
        result.token_logprobs.append(lp.logprob)
        result.top_logprobs.append({texts(i): v for i, v in lp.top[:top_n]} if top_n else None)
        result.text_offset.append(offset)
        offset += len(token)
    return result
