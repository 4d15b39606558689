"""Which model names this server answers to, and the /v1/models listing."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from app.engine import ModelInfo
from app.engine.server.embedder import Embedder
from app.engine.server.errors import ApiError, model_not_found
from app.engine.server.protocol import anthropic
from app.engine.server.protocol.openai import ModelCard, ModelList
from app.engine.server.settings import ServerSettings


class ServedModels:
    """The loaded chat model under its own name and aliases, and the embedding model if there is one."""

    def __init__(self, model: ModelInfo, embedder: Embedder | None, settings: ServerSettings) -> None:
        self.model = model
        self.chat_names = _unique([model.name, *settings.model_aliases])
        self.embedding_names = (
            _unique([embedder.model_name, *settings.embedding_model_aliases]) if embedder else []
        )
        self._created = int(time.time())

    def check_chat(self, name: str | None) -> ApiError | None:
        """None when `name` is the loaded model (or left out where the protocol allows that)."""
        if name is None or name in self.chat_names:
            return None
        return model_not_found(name, self.chat_names)

    def check_embedding(self, name: str) -> ApiError | None:
        if not self.embedding_names:
            return ApiError(
                404, "No embedding model is loaded on this server.", param="model", code="model_not_found"
            )
        if name in self.embedding_names:
            return None
        return model_not_found(name, self.embedding_names)

    def listing(self) -> ModelList:
        vision, audio = self.model.supports_vision, getattr(self.model, "supports_audio", False)
        mix = dict(self.model.quant_mix) or None
        m = self.model
        cards = [
            ModelCard.chat(name, self._created, m.context_length, vision, m.quantization, mix, audio)
            for name in self.chat_names
        ]
        cards += [ModelCard(id=name, created=self._created) for name in self.embedding_names]
        return ModelList(data=cards)

    def card(self, name: str) -> ModelCard | None:
        return next((card for card in self.listing().data if card.id == name), None)

    def anthropic_listing(self) -> anthropic.ModelListResponse:
        """The chat model's names in Anthropic's shape (its Models API lists only models /v1/messages takes)."""
        created = datetime.fromtimestamp(self._created, UTC).isoformat().replace("+00:00", "Z")
        context = self.model.context_length
        models = [
            anthropic.ModelInfo(
                id=name, display_name=name, created_at=created, max_input_tokens=context, max_tokens=context
            )
            for name in self.chat_names
        ]
        return anthropic.ModelListResponse(data=models, first_id=models[0].id, last_id=models[-1].id)

    def anthropic_card(self, name: str) -> anthropic.ModelInfo | None:
        return next((model for model in self.anthropic_listing().data if model.id == name), None)


def _short(name: str) -> str:
    """`org/model` is also answered as "model" (clients often drop the hub organisation)."""
    return name.rsplit("/", 1)[-1]


def _unique(names: list[str]) -> list[str]:
    return list(dict.fromkeys(name for name in names if name))
