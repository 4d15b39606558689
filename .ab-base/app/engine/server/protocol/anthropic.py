"""Anthropic Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`), pydantic only.

Content blocks are a union tagged by `type`. Thinking blocks a client sends back are
accepted and dropped; images and documents are refused by the serving layer (the
engine reads text only). `system` turns inside `messages` (Claude Code sends them for
models it does not know) join the system prompt. `cache_control`, `context_management`,
`thinking` and other fields Claude Code sends that do not apply here are ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.engine import GrammarSpec, SamplingParams
from app.engine.server.limits import MAX_MESSAGES, MAX_TOOLS, EdgeChecked, StopSequences

# ---- request --------------------------------------------------------------------------------


class TextBlockParam(BaseModel):
    type: Literal["text"]
    text: str


class ImageBlockParam(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["image", "document"]


class ToolUseBlockParam(BaseModel):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)


class ToolResultBlockParam(BaseModel):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlockParam | ImageBlockParam] | None = None
    is_error: bool | None = None


class ThinkingBlockParam(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["thinking", "redacted_thinking"]


ContentBlockParam = Annotated[
    TextBlockParam | ImageBlockParam | ToolUseBlockParam | ToolResultBlockParam | ThinkingBlockParam,
    Field(discriminator="type"),
]


class MessageParam(BaseModel):
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlockParam]


class ToolParam(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    type: str | None = None  # "custom" or absent; hosted tools are not available locally


class ToolChoiceParam(BaseModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class MetadataParam(BaseModel):
    user_id: str | None = None


class CountTokensRequest(EdgeChecked):
    model: str
    messages: list[MessageParam] = Field(min_length=1, max_length=MAX_MESSAGES)
    system: str | list[TextBlockParam] | None = None
    tools: list[ToolParam] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: ToolChoiceParam | None = None
    thinking: dict[str, Any] | None = None  # accepted and ignored


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: StopSequences = None
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    metadata: MetadataParam | None = None

    def to_sampling_params(
        self, max_tokens: int, template_stops: list[str], grammar: GrammarSpec | None = None
    ) -> SamplingParams:
        """Raises ValueError naming the first field out of range."""
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            stop=list(dict.fromkeys([*(self.stop_sequences or []), *template_stops])),
            grammar=grammar,
        )


# ---- response -------------------------------------------------------------------------------


class TextBlock(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ThinkingBlock(BaseModel):
    """The model's reasoning (GPT-OSS's analysis channel). This server signs nothing: `signature`
    is empty, and a client that sends the block back has it ignored (see ContentBlockParam)."""

    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str = ""


class ToolUseBlock(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


ContentBlock = Annotated[ThinkingBlock | TextBlock | ToolUseBlock, Field(discriminator="type")]
StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class OutputTokensDetails(BaseModel):
    thinking_tokens: int  # counted in output_tokens too, thinking-block delimiters included
    # speculative decoding (an extension, OpenAI's names): drafted tokens accepted and rejected
    accepted_prediction_tokens: int | None = Field(default=None, exclude_if=lambda v: v is None)
    rejected_prediction_tokens: int | None = Field(default=None, exclude_if=lambda v: v is None)


class Usage(BaseModel):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    output_tokens_details: OutputTokensDetails | None = Field(default=None, exclude_if=lambda v: v is None)


class MessageResponse(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ContentBlock]
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: Usage


class CountTokensResponse(BaseModel):
    input_tokens: int


class ModelInfo(BaseModel):
    """GET /v1/models as Anthropic answers it (to requests carrying `anthropic-version`)."""

    type: Literal["model"] = "model"
    id: str
    display_name: str
    created_at: str  # RFC 3339
    max_input_tokens: int | None = None
    max_tokens: int | None = None


class ModelListResponse(BaseModel):
    data: list[ModelInfo]
    has_more: bool = False
    first_id: str | None = None
    last_id: str | None = None


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicErrorResponse(BaseModel):
    type: Literal["error"] = "error"
    error: AnthropicErrorDetail
