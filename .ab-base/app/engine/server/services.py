"""One instance of every serving class over one shared context: what routes and MCP tools call."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.engine import EngineClient
from app.engine.server.embedder import Embedder
from app.engine.server.protocol.openai import ModelCard, ModelList
from app.engine.server.serving_audio import OpenAIServingTranscription
from app.engine.server.serving_base import ServingContext, now
from app.engine.server.serving_chat import OpenAIServingChat
from app.engine.server.serving_completions import OpenAIServingCompletions
from app.engine.server.serving_embeddings import OpenAIServingEmbeddings
from app.engine.server.serving_messages import AnthropicServingMessages
from app.engine.server.serving_rerank import ServingRerank
from app.engine.server.serving_responses import OpenAIServingResponses
from app.engine.server.serving_tokenize import ServingTokenization
from app.engine.server.settings import ServerSettings
from app.engine.tasks.audio import Transcriber
from app.engine.tasks.rerank import DECODER_YES_NO, Reranker


@dataclass
class Services:
    ctx: ServingContext
    chat: OpenAIServingChat
    completions: OpenAIServingCompletions
    responses: OpenAIServingResponses
    messages: AnthropicServingMessages
    embeddings: OpenAIServingEmbeddings
    tokenization: ServingTokenization
    transcription: OpenAIServingTranscription
    rerank: ServingRerank

    @classmethod
    def build(
        cls,
        engine: EngineClient,
        embedder: Embedder | None,
        settings: ServerSettings,
        transcriber: Transcriber | None = None,
        reranker: Reranker | None = None,
        speech_models: Sequence[Any] = (),
    ) -> Services:
        """`reranker`: a model loaded for /v1/rerank (Qwen3-Reranker); None scores with the embedder."""
        ctx = ServingContext.build(engine, embedder, settings)
        return cls(
            ctx=ctx,
            chat=OpenAIServingChat(ctx),
            completions=OpenAIServingCompletions(ctx),
            responses=OpenAIServingResponses(ctx),
            messages=AnthropicServingMessages(ctx),
            embeddings=OpenAIServingEmbeddings(ctx),
            tokenization=ServingTokenization(ctx),
            transcription=OpenAIServingTranscription(
                transcriber,
                created=now(),
                max_seconds=settings.max_audio_seconds,
                speech_models=speech_models,
            ),
            rerank=ServingRerank(ctx, reranker),
        )

    def model_listing(self) -> ModelList:
        """/v1/models: the chat and embedding models, a reranking model loaded for /v1/rerank, then the
        transcription model (as OpenAI lists whisper-1)."""
        cards = self.ctx.models.listing().data
        reranker = self.rerank.reranker
        loaded = reranker is not None and reranker.method == DECODER_YES_NO  # not the embedder's cosines
        if loaded and all(card.id != reranker.model_name for card in cards):  # type: ignore[union-attr]
            cards.append(ModelCard(id=reranker.model_name, created=int(now())))  # type: ignore[union-attr]
        return ModelList(data=[*cards, *self.transcription.model_cards()])

    def model_card(self, name: str) -> ModelCard | None:
        return next((card for card in self.model_listing().data if card.id == name), None)
