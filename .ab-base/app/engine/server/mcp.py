"""The engine as MCP tools (generate, chat, embed, count_tokens), over streamable HTTP at /mcp or stdio.

The tools go through the same serving classes as the HTTP API, so limits, context
checks and errors behave identically; an API error becomes an MCP tool error.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field, ValidationError

from app.engine.server.errors import ApiError, describe_validation_errors
from app.engine.server.protocol.chat import ChatCompletionRequest, ChatMessage
from app.engine.server.protocol.completions import CompletionRequest
from app.engine.server.protocol.embeddings import EmbeddingRequest
from app.engine.server.protocol.tokenize import TokenizeRequest
from app.engine.server.services import Services

RequestT = TypeVar("RequestT", bound=BaseModel)


class TurnInput(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str


class GenerationResult(BaseModel):
    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int


class EmbeddingResult(BaseModel):
    model: str
    dimensions: int
    embeddings: list[list[float]]
    prompt_tokens: int


class TokenCount(BaseModel):
    tokens: int = Field(description="prompt tokens, chat template included when messages are given")


def build_mcp_server(services: Services) -> MCPServer:
    ctx = services.ctx
    model = ctx.models.chat_names[0]
    server = MCPServer(
        name="paddock",
        log_level=ctx.settings.log_level.upper(),  # type: ignore[arg-type]
        instructions=f"Local language model {model}: generate or chat with it, embed texts, count tokens.",
    )

    @server.tool(description="Continue a raw text prompt with the loaded model (no chat template).")
    async def generate(
        prompt: str, max_tokens: int = 256, temperature: float = 0.0, stop: list[str] | None = None
    ) -> GenerationResult:
        request = _request(
            CompletionRequest,
            model=model,
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=temperature,
            stop=stop,
        )
        result = _unwrap(await services.completions.create(request))
        choice = result.choices[0]
        usage = result.usage
        return GenerationResult(
            text=choice.text,
            finish_reason=choice.finish_reason,
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
        )

    @server.tool(description="Reply to a conversation with the loaded model, through its chat template.")
    async def chat(
        messages: list[TurnInput], max_tokens: int = 512, temperature: float = 0.0
    ) -> GenerationResult:
        turns = [ChatMessage(role=m.role, content=m.content) for m in messages]
        request = _request(
            ChatCompletionRequest, model=model, messages=turns, max_tokens=max_tokens, temperature=temperature
        )
        result = _unwrap(await services.chat.create(request))
        choice = result.choices[0]
        return GenerationResult(
            text=choice.message.content or "",
            finish_reason=choice.finish_reason,
            prompt_tokens=result.usage.prompt_tokens,
            completion_tokens=result.usage.completion_tokens,
        )

    @server.tool(description="Embed texts with the embedding model; vectors are L2-normalised.")
    async def embed(texts: list[str]) -> EmbeddingResult:
        names = ctx.models.embedding_names
        if not names:
            raise ToolError("No embedding model is loaded on this server.")
        result = _unwrap(
            await services.embeddings.create(_request(EmbeddingRequest, model=names[0], input=texts))
        )
        vectors: list[Any] = [item.embedding for item in result.data]
        return EmbeddingResult(
            model=result.model,
            dimensions=len(vectors[0]) if vectors else 0,
            embeddings=vectors,
            prompt_tokens=result.usage.prompt_tokens,
        )

    @server.tool(
        description="Count prompt tokens of a text, or of chat messages rendered through the chat template."
    )
    async def count_tokens(text: str | None = None, messages: list[TurnInput] | None = None) -> TokenCount:
        if (text is None) == (messages is None):
            raise ToolError("Give exactly one of 'text' or 'messages'.")
        turns = (
            [ChatMessage(role=m.role, content=m.content) for m in messages] if messages is not None else None
        )
        request = _request(TokenizeRequest, prompt=text, messages=turns)
        result = _unwrap(await ctx.prompts.off_loop(services.tokenization.tokenize, request))
        return TokenCount(tokens=result.count)

    return server


def _unwrap(result: Any) -> Any:
    if isinstance(result, ApiError):
        raise ToolError(result.message)
    return result


def _request(kind: type[RequestT], /, **fields: Any) -> RequestT:
    """The protocol request the HTTP API would get; a value it refuses is a tool error saying which and
    why, as the API's 400 does (it was "Error executing tool generate" with the reason left in the log)."""
    try:
        return kind(**fields)
    except ValidationError as exc:
        message, _ = describe_validation_errors(list(exc.errors(include_url=False)))
        raise ToolError(message) from None


async def run_stdio(engine: Any, embedder: Any = None, settings: Any = None) -> None:
    """Serve the MCP tools on stdin/stdout until the client closes them (`paddock mcp`)."""
    from app.engine.server.settings import ServerSettings

    services = Services.build(engine, embedder, settings or ServerSettings())
    await build_mcp_server(services).run_stdio_async()
