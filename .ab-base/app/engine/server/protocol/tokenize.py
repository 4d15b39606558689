"""`POST /tokenize` and `POST /detokenize` in vLLM's shape, pydantic only."""

from __future__ import annotations

from typing import Any, Self

from pydantic import BaseModel, Field, model_validator

from app.engine.server.limits import MAX_MESSAGES, MAX_TOOLS, EdgeChecked
from app.engine.server.protocol.chat import ChatMessage
from app.engine.server.protocol.openai import ChatTool


class TokenizeRequest(EdgeChecked):
    """Either a raw `prompt` or chat `messages` (rendered through the chat template)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, max_length=MAX_MESSAGES)
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    tools: list[ChatTool] | None = Field(default=None, max_length=MAX_TOOLS)
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _exactly_one_input(self) -> Self:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of 'prompt' or 'messages'")
        return self


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = Field(default=None, exclude_if=lambda v: v is None)


class DetokenizeRequest(BaseModel):
    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str
