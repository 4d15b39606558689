"""The pieces every OpenAI-style endpoint shares (pydantic only): errors, usage, models, tools, sampling.

Field names follow the OpenAI API reference; fields marked "extension" are the ones
vLLM accepts beyond it (top_k, min_p, ignore_eos, min_tokens, ...), so tools written
for vLLM (aiperf among them) run unchanged. Unknown fields are ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.engine import SamplingParams
from app.engine.server.limits import MAX_STOP_TOKEN_IDS, EdgeChecked

# ---- shared ---------------------------------------------------------------------------------


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int = 0  # counted in completion_tokens too
    # speculative decoding, under OpenAI's predicted-output names: drafted tokens the model accepted
    # and rejected (absent when nothing was drafted)
    accepted_prediction_tokens: int | None = Field(default=None, exclude_if=lambda v: v is None)
    rejected_prediction_tokens: int | None = Field(default=None, exclude_if=lambda v: v is None)


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int = 0
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None
    # chat only (a plain completion has no reasoning split from its text)
    completion_tokens_details: CompletionTokensDetails | None = Field(
        default=None, exclude_if=lambda v: v is None
    )


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingExtensions(EdgeChecked):
    """Sampling fields shared by chat and completions, beyond the OpenAI reference (vLLM's names)."""

    top_k: int | None = Field(default=None, ge=-1, description="extension: sample from the k best tokens")
    min_p: float | None = Field(default=None, ge=0.0, le=1.0, description="extension")
    repetition_penalty: float | None = Field(default=None, gt=0.0, description="extension")
    min_tokens: int = Field(default=0, ge=0, description="extension: tokens generated before EOS may stop")
    ignore_eos: bool = Field(default=False, description="extension: keep generating past EOS")
    stop_token_ids: list[int] | None = Field(
        default=None, max_length=MAX_STOP_TOKEN_IDS, description="extension: ids inside the vocabulary"
    )
    include_stop_str_in_output: bool = Field(default=False, description="extension")
    skip_special_tokens: bool = Field(default=True, description="extension")

    def _sampling_params(
        self, *, stop: str | list[str] | None, extra_stop: list[str], **standard: Any
    ) -> SamplingParams:
        """SamplingParams from the standard fields a subclass passes in and the extensions here."""
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        return SamplingParams(
            top_k=self.top_k or 0,
            min_p=self.min_p or 0.0,
            repetition_penalty=self.repetition_penalty or 1.0,
            min_tokens=self.min_tokens,
            ignore_eos=self.ignore_eos,
            stop=list(dict.fromkeys(stops + extra_stop)),
            stop_token_ids=list(self.stop_token_ids or []),
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens,
            **standard,
        )


class ModelCard(BaseModel):
    """A model as OpenAI lists it, plus the context size under each name a client reads it by:
    vLLM's `max_model_len`, litellm's and aider's `max_input_tokens`/`max_output_tokens`,
    `context_length` (OpenRouter, LM Studio) and `context_window`. Each bounds one side; the
    prompt and the output together must still fit `max_model_len`."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "paddock"
    max_model_len: int | None = None
    context_length: int | None = None
    context_window: int | None = None
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    input_modalities: list[str] | None = None  # what the model reads: ["text"] or ["text", "image"]
    # The weights' formats: the file's label, and tensors per format (a checkpoint mixes them per tensor).
    quantization: str | None = None
    quant_mix: dict[str, int] | None = None

    @classmethod
    def chat(
        cls, name: str, created: int, context_length: int, vision: bool = False, quantization: str | None = None,
        quant_mix: dict[str, int] | None = None, audio: bool = False,
    ) -> ModelCard:  # fmt: skip
        n = context_length
        return cls(
            id=name,
            created=created,
            input_modalities=["text"] + ["image"] * vision + ["audio"] * audio,
            quantization=quantization,
            quant_mix=quant_mix,
            max_model_len=n,
            context_length=n,
            context_window=n,
            max_input_tokens=n,
            max_output_tokens=n,
        )


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# ---- tools and output format ---------------------------------------------------------------


class FunctionDefinition(BaseModel):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class FunctionName(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    name: str = "response"
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "function_call"]
