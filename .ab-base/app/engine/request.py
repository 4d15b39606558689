"""Per-request state inside the engine, and what the engine reports back.

`Request` is mutable bookkeeping owned by the engine thread: token ids, how many of
them already have KV in the cache, the block table, status. `RequestOutput` is the
immutable delta handed to callers after each step.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field, replace
from typing import Any

from app.engine.cache.block_table import BlockTableField
from app.engine.images import PromptImage
from app.engine.sampling_params import SamplingParams

# An output token sampled on the device and not yet read back (core/pipeline.py): it stands in
# `output_token_ids` for one step so that the next step is scheduled one token further. It is
# always the request's last token and never has KV (`num_computed_tokens` stops before it).
PLACEHOLDER = -1


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_ERROR = "finished_error"  # this request alone failed (sampling, detokenizing)

    @property
    def finished(self) -> bool:
        return self in _FINISHED

    @property
    def finish_reason(self) -> str | None:
        return _FINISH_REASON.get(self)


_FINISH_REASON = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}
_FINISHED = set(_FINISH_REASON)


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    session_id: str = "default"  # fairness key: requests of one client/session share a turn
    arrival_time: float = field(default_factory=time.monotonic)
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose KV is already in the cache
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    # where those came from: "device" (the radix tree), "host", "disk" (cache/offload.py)
    cached_tokens_by_tier: dict[str, int] = field(default_factory=dict)
    # the block table: always a cache.block_table.BlockTable (a list with an int32 copy in step)
    block_ids: list[int] = BlockTableField()  # type: ignore[assignment]  # noqa: RUF009 (a descriptor, one per class)
    status: RequestStatus = RequestStatus.WAITING
    # hybrid models: the row of the recurrent state arrays this request's state lives in while it
    # runs (cache/state_cache.py); None while it waits, or on a model without recurrent layers
    state_slot: int | None = None
    stop_reason: str | int | None = None
    first_token_time: float | None = None
    images: list[PromptImage] = field(default_factory=list)  # in prompt order, not overlapping
    # what the penalties read of the token history, folded in step by step: the sampler's own
    # sample/history.py TokenHistory (not named here: the request is a leaf below the sampler)
    token_history: Any = field(default=None, repr=False, compare=False)
    # speculative decoding (app/engine/spec/): tokens proposed for the next step, set just before
    # `schedule()` (the scheduler moves them into the decode's chunk), and the totals so far
    draft_token_ids: list[int] = field(default_factory=list)
    num_draft_tokens: int = 0  # drafted and verified
    num_accepted_tokens: int = 0  # of those, accepted

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def cache_token_ids(self) -> list[int]:
        """The prefix cache's key for this request's tokens: `all_token_ids` with each image's
        tokens replaced by its content's stand-in id, so that a cached image matches only itself."""
        tokens = self.all_token_ids
        for image in self.images:
            tokens[image.start : image.end] = [image.image.cache_id] * (image.end - image.start)
        return tokens

    def cache_token_prefix(self, n: int) -> list[int]:
        """`cache_token_ids[:n]` without building the whole list first when no image changes it
        (one copy of the first n tokens instead of three of the whole context: at 32k tokens
        that was ~100 us per admission and per release)."""
        if self.images:
            return self.cache_token_ids[:n]
        prompt = self.prompt_token_ids
        if n <= len(prompt):
            return prompt[:n]
        return prompt + self.output_token_ids[: n - len(prompt)]

    def chunk_before_image(self, start: int, num_tokens: int) -> int:
        """`num_tokens`, cut so that a chunk from `start` does not end inside an image it begins
        after: an image's tokens attend to each other both ways, so they go in one step. (A chunk
        that starts inside an image, when the budget is smaller than the image, is left alone.)"""
        end = start + num_tokens
        for image in self.images:
            if start < image.start < end < image.end:
                return image.start - start
        return num_tokens

    @property
    def num_pending_tokens(self) -> int:
        """Known tokens that still lack KV: the rest of the prompt, or the last sampled token.

        One rule covers prefill, chunked prefill, decode and recompute after preemption:
        a step that processes all pending tokens also samples the next one.
        """
        return self.num_tokens - self.num_computed_tokens


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), best first


@dataclass(frozen=True)
class RequestOutput:
    """What one step produced for one request: new tokens and text, and totals so far."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    logprobs: list[TokenLogprob] | None
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | "error" | None while running
    stop_reason: str | int | None  # the stop string or token id that ended it
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int = 0
    error: str | None = None  # why this request failed (finish_reason "error")
    num_draft_tokens: int = 0  # speculative decoding: tokens drafted and verified so far
    num_accepted_tokens: int = 0  # of those, accepted

    def followed_by(self, later: RequestOutput) -> RequestOutput:
        """This output and the `later` one of the same request as one: the new tokens, text and
        logprobs of both, the totals and the finish of the later one."""
        if later.request_id != self.request_id:
            raise ValueError(f"outputs of requests {self.request_id!r} and {later.request_id!r} do not join")
        if self.finished:
            raise ValueError(f"request {self.request_id!r} has no output after its finished one")
        logprobs = self.logprobs if later.logprobs is None else (self.logprobs or []) + later.logprobs
        return replace(
            later,
            new_token_ids=self.new_token_ids + later.new_token_ids,
            new_text=self.new_text + later.new_text,
            logprobs=logprobs,
        )
