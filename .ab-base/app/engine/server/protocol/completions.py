"""OpenAI legacy completions (`POST /v1/completions`), pydantic only."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from app.engine.sampling_params import MAX_TOP_LOGPROBS, SamplingParams
from app.engine.server.limits import MAX_LOGIT_BIAS, Seed, Stop
from app.engine.server.protocol.openai import FinishReason, StreamOptions, UsageInfo
from app.engine.server.protocol.openai import SamplingExtensions as _SamplingExtensions

Prompt = str | list[str] | list[int] | list[list[int]]


class CompletionRequest(_SamplingExtensions):
    model: str
    prompt: Prompt = Field(
        description="a text, token ids, or a list of either (at most the server's max_prompts)"
    )
    best_of: int | None = Field(default=None, ge=1)
    echo: bool = False
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = Field(default=None, max_length=MAX_LOGIT_BIAS)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    max_tokens: int | None = Field(default=16, ge=1)
    n: int = Field(default=1, ge=1, description="at most the server's max_choices (16 by default)")
    seed: Seed = None
    stop: Stop = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    suffix: str | None = None
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    user: str | None = None
    add_special_tokens: bool = Field(
        default=True, description="extension: add BOS as the model's tokenizer says"
    )

    def to_sampling_params(self, max_tokens: int, seed: int | None) -> SamplingParams:
        """Raises ValueError naming the first field out of range."""
        return self._sampling_params(
            stop=self.stop,
            extra_stop=[],
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            seed=seed,
            logprobs=self.logprobs,
        )


class CompletionLogprobs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = Field(default=None, description="extension: the stop string or token id")


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None
