"""OpenAI chat completions (`POST /v1/chat/completions`), pydantic only."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.engine import GrammarSpec
from app.engine.sampling_params import MAX_TOP_LOGPROBS, SamplingParams
from app.engine.server.limits import MAX_LOGIT_BIAS, MAX_MESSAGES, MAX_TOOLS, Seed, Stop
from app.engine.server.protocol.openai import (
    ChatTool,
    FinishReason,
    ResponseFormat,
    SamplingExtensions,
    StreamOptions,
    ToolChoice,
    UsageInfo,
)

# ---- chat request ---------------------------------------------------------------------------


class ContentPart(BaseModel):
    """A part of a message's content. Only text parts can be served by a text-only model."""

    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class FunctionCallIn(BaseModel):
    name: str
    arguments: str = "{}"


class ToolCallIn(BaseModel):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None


class ChatCompletionRequest(SamplingExtensions):
    model: str
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = Field(default=None, max_length=MAX_LOGIT_BIAS)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    max_tokens: int | None = Field(
        default=None, ge=1, description="deprecated alias of max_completion_tokens"
    )
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1, description="at most the server's max_choices (16 by default)")
    seed: Seed = None
    stop: Stop = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    tools: list[ChatTool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    user: str | None = None
    chat_template_kwargs: dict[str, Any] | None = Field(default=None, description="extension")
    add_generation_prompt: bool = Field(default=True, description="extension")

    def to_sampling_params(
        self, max_tokens: int, template_stops: list[str], seed: int | None, grammar: GrammarSpec | None = None
    ) -> SamplingParams:
        """Raises ValueError naming the first field out of range."""
        return self._sampling_params(
            stop=self.stop,
            extra_stop=template_stops,
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            seed=seed,
            logprobs=(self.top_logprobs or 0) if self.logprobs else None,
            grammar=grammar,
        )


# ---- chat response --------------------------------------------------------------------------


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprobInfo(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprobInfo] | None = None
    refusal: list[TokenLogprobInfo] | None = None


class FunctionCallOut(BaseModel):
    name: str
    arguments: str


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    # the model's reasoning (GPT-OSS's analysis channel), as vLLM and DeepSeek's API name it
    reasoning_content: str | None = Field(default=None, exclude_if=lambda v: v is None)
    refusal: str | None = None
    tool_calls: list[ToolCallOut] | None = Field(default=None, exclude_if=lambda v: not v)


# Set only when response_format asked for JSON and the output does not match it (cut short by max_tokens).
JsonError = Annotated[
    str | None, Field(default=None, exclude_if=lambda v: v is None, description="extension")
]


class ChatChoice(BaseModel):
    index: int
    message: ResponseMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = Field(default=None, description="extension: the stop string or token id")
    json_error: JsonError = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None


class ToolCallDelta(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallOut | None = None


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = Field(default=None, exclude_if=lambda v: v is None)
    content: str | None = Field(default=None, exclude_if=lambda v: v is None)
    reasoning_content: str | None = Field(default=None, exclude_if=lambda v: v is None)
    tool_calls: list[ToolCallDelta] | None = Field(default=None, exclude_if=lambda v: v is None)


class ChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = Field(default=None, exclude_if=lambda v: v is None)
    json_error: JsonError = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None
