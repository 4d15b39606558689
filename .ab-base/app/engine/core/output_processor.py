"""Per-request text and stop conditions: sampled ids in, `RequestOutput` deltas out.

Text is detokenized incrementally. While a stop string could still be forming at the
end of the text, that tail is held back, so a caller never sees text that a stop string
later removes. Only that tail: the longest end of the text that begins some stop string.
(Holding back the longest stop's length less one character, as before, kept a chat
template's `<|im_end|>` from showing a short first token until the second arrived: the
first visible text came one decode step late.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.engine.request import Request, RequestOutput, RequestStatus, TokenLogprob


@dataclass
class _TextState:
    detokenizer: Any
    text: str = ""
    emitted: int = 0  # characters of `text` already handed out
    logprobs: list[TokenLogprob] = field(default_factory=list)
    new_token_ids: list[int] = field(default_factory=list)


class OutputProcessor:
    def __init__(self, tokenizer: Any, max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self._states: dict[str, _TextState] = {}

    def add(self, request: Request) -> None:
        skip = request.sampling_params.skip_special_tokens
        self._states[request.request_id] = _TextState(self.tokenizer.detokenizer(skip_special_tokens=skip))

    def forget(self, request_id: str) -> None:
        self._states.pop(request_id, None)

    def process(self, request: Request, token_id: int, logprob: TokenLogprob | None) -> RequestStatus | None:
        """Account for one new token; return the finished status if the request must stop now."""
        state = self._states[request.request_id]
        params = request.sampling_params
        state.new_token_ids.append(token_id)
        if logprob is not None:
            state.logprobs.append(logprob)
        may_stop = request.num_output_tokens >= params.min_tokens
        if may_stop and token_id in params.stop_token_ids:
            request.stop_reason = token_id
            return RequestStatus.FINISHED_STOPPED
        if may_stop and not params.ignore_eos and token_id in self.tokenizer.eos_token_ids:
            return RequestStatus.FINISHED_STOPPED
        state.text += state.detokenizer.add([token_id])
        if may_stop and params.stop and self._cut_at_stop_string(request, state):
            return RequestStatus.FINISHED_STOPPED
        if params.max_tokens is not None and request.num_output_tokens >= params.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        if request.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _cut_at_stop_string(self, request: Request, state: _TextState) -> bool:
        params = request.sampling_params
        longest = max(len(s) for s in params.stop)
        search_from = max(0, state.emitted - longest + 1)
        hits = [(state.text.find(s, search_from), s) for s in params.stop]
        hits = [(i, s) for i, s in hits if i >= 0]
        if not hits:
            return False
        index, stop = min(hits)
        state.text = (
            state.text[: index + len(stop)] if params.include_stop_str_in_output else state.text[:index]
        )
        request.stop_reason = stop
        return True

    def output(self, request: Request) -> RequestOutput:
        """The delta since the last output: new ids, text safe to show, logprobs."""
        state = self._states[request.request_id]
        finished = request.status.finished
        if finished and not isinstance(request.stop_reason, str):  # a stop string already cut the text
            state.text += state.detokenizer.flush()
        visible = len(state.text)
        stops = request.sampling_params.stop
        if stops and not finished:
            visible = max(state.emitted, len(state.text) - stop_prefix_at_end(state.text, stops))
        new_text = state.text[state.emitted : visible]
        state.emitted = visible
        out = RequestOutput(
            request_id=request.request_id,
            new_token_ids=state.new_token_ids,
            new_text=new_text,
            logprobs=state.logprobs if request.sampling_params.logprobs is not None else None,
            finished=finished,
            finish_reason=request.status.finish_reason,
            stop_reason=request.stop_reason,
            num_prompt_tokens=request.num_prompt_tokens,
            num_output_tokens=request.num_output_tokens,
            num_cached_tokens=request.num_cached_tokens,
            num_draft_tokens=request.num_draft_tokens,
            num_accepted_tokens=request.num_accepted_tokens,
        )
        state.new_token_ids, state.logprobs = [], []
        return out


def stop_prefix_at_end(text: str, stops: list[str]) -> int:
    """Characters at the end of `text` that could begin a stop string: the longest suffix that is a
    proper prefix of one (a whole stop string was cut before this is asked)."""
    longest = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:k]):
                longest = k
                break
    return longest
