"""A live server whose /v1/audio/transcriptions serves speech LLMs beside a Whisper that is never loaded
(the chat engine a fake): what the Qwen3-ASR and Gemma 4 transcription tests share."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from app.engine.server.app import create_app
from app.engine.server.launch import ServerHandle
from app.engine.server.settings import ServerSettings
from app.engine.tasks.audio import Transcriber
from app.engine.tasks.speech_llm import SpeechLLMTranscriber

from .fakes import FakeEngine


def load_named(fixture: Path, folder: Path, max_reply_tokens: int) -> SpeechLLMTranscriber:
    """The speech LLM of `fixture` copied to `folder` (it is served by its folder name), its replies cut
    at the length the transformers reference ran."""
    shutil.copytree(fixture, folder)
    model = SpeechLLMTranscriber.load(folder, device="cpu")
    model.max_reply_tokens = max_reply_tokens
    return model


@contextmanager
def speech_llm_server(models: list[SpeechLLMTranscriber]) -> Iterator[str]:
    """The server's base URL; on leaving, checks that no request went to Whisper."""
    whisper = Transcriber(device="cpu")  # not loaded unless a request names it

    def factory(engine: Any, embedder: Any, settings: ServerSettings) -> Any:
        return create_app(engine, embedder=embedder, settings=settings, transcriber=whisper, speech_models=models)

    with ServerHandle(FakeEngine(), settings=ServerSettings(port=0), app_factory=factory) as handle:
        yield handle.base_url
    assert not whisper.loaded  # every request went to a speech LLM
