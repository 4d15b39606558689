"""What every serving class shares: the engine, prompt building, served names, metrics, settings."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from app.engine import EngineClient, GenerationRequest, SamplingParams
from app.engine.server import sessions
from app.engine.server.audio_parts import load_audio
from app.engine.server.embedder import Embedder
from app.engine.server.errors import bad_request
from app.engine.server.generation import Completed, Generation
from app.engine.server.images import ImageCollector, load_images
from app.engine.server.limits import SEED_MAX
from app.engine.server.metrics import ServerMetrics
from app.engine.server.prompting import Prompt, PromptBuilder
from app.engine.server.reasoning_tokens import count_reasoning_tokens
from app.engine.server.served_models import ServedModels
from app.engine.server.settings import ServerSettings

# The request field that holds the prompt, per endpoint, for errors about it (chat and messages: "messages")
PROMPT_PARAMS = {"completions": "prompt", "responses": "input"}


@dataclass
class ServingContext:
    engine: EngineClient
    embedder: Embedder | None
    settings: ServerSettings
    models: ServedModels
    metrics: ServerMetrics
    prompts: PromptBuilder

    @classmethod
    def build(
        cls, engine: EngineClient, embedder: Embedder | None, settings: ServerSettings
    ) -> ServingContext:
        return cls(
            engine=engine,
            embedder=embedder,
            settings=settings,
            models=ServedModels(engine.model, embedder, settings),
            metrics=ServerMetrics(engine),
            prompts=PromptBuilder(
                engine, settings.prompt_workers, settings.remembered_turns, settings.strip_volatile_metadata
            ),
        )

    def generation(
        self, prompt: Prompt, params: SamplingParams, endpoint: str, session_id: str | None
    ) -> Generation:
        """The engine request for one choice; `session_id` is the user the body names (or None),
        combined with the caller's key or connection (sessions.py)."""
        vocab = self.engine.tokenizer.vocab_size
        bad = next((i for i in params.stop_token_ids if not 0 <= i < vocab), None)
        if bad is not None:  # the sampler indexes logits by these ids
            raise bad_request(
                f"Token id {bad} is outside the vocabulary (0..{vocab - 1}).", param="stop_token_ids"
            )
        request = GenerationRequest(
            prompt.token_ids, params, session_id=sessions.session_id(session_id), images=list(prompt.images)
        )
        remember = (lambda ids: self.prompts.remember(prompt, ids)) if prompt.remembered else None
        return Generation(
            self.engine, request, self.metrics, endpoint, PROMPT_PARAMS.get(endpoint, "messages"), remember
        )

    def reasoning_tokens(self, result: Completed) -> int:
        """How many of the generated tokens were reasoning (GPT-OSS's analysis channel); see reasoning_tokens.py."""
        return count_reasoning_tokens(self.engine.chat_template, self.engine.tokenizer, result.token_ids)

    def load_images(self, images: ImageCollector) -> list[Any]:
        """The collected image parts, decoded and preprocessed for the loaded model (400s on bad ones)."""
        return load_images(images.sources, self.prompts.vision, self.settings)

    def load_audio(self, parts: ImageCollector) -> list[Any]:
        """The collected input_audio parts, decoded to the loaded model's audio inputs (400s on bad ones)."""
        return load_audio(parts.audio, self.prompts.audio, self.settings)


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def seeded(seed: int | None, index: int) -> int | None:
    """Choice `index` of n gets its own seed, so n samples of one seeded request differ but repeat."""
    return None if seed is None else (seed + index) % (SEED_MAX + 1)
