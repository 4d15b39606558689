"""OpenAI audio transcriptions: an uploaded file -> the transcriber `model` names -> json, text, srt, vtt.

The app's Whisper `Transcriber` (faster-whisper) answers its own name and OpenAI's `whisper-1`, and
stays the default; speech LLMs loaded beside it (`paddock serve --asr-model`: Qwen3-ASR, Granite Speech or
Gemma 4, tasks/speech_llm.py) answer their own names, with the same calls and formats.

The Transcriber is shared by every request of an app. Its model loads on the first
transcription, inside the worker thread that runs it (the Transcriber's own lock makes that
happen once), so neither the load nor the decoding ever blocks the event loop. A client that
hangs up cancels its transcription between segments, which frees the CPU for the next one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Literal

import anyio
from fastapi.responses import Response

from app.engine.server.errors import ApiError, bad_request, client_closed, model_not_found
from app.engine.server.protocol.audio import TranscriptionForm
from app.engine.server.protocol.openai import ModelCard
from app.engine.server.settings import DEFAULT_MAX_AUDIO_BODY_BYTES
from app.engine.tasks import transcript_formats as formats
from app.engine.tasks.audio import AudioError, Transcriber, Transcript, TranscriptionCancelled

if TYPE_CHECKING:
    from app.engine.tasks.speech_llm import SpeechLLMTranscriber

log = logging.getLogger(__name__)

TRANSCRIPTIONS_PATH = "/v1/audio/transcriptions"
MAX_AUDIO_BODY_BYTES = DEFAULT_MAX_AUDIO_BODY_BYTES
# What OpenAI clients send by default; answered by whichever Whisper model is loaded.
WHISPER_ALIASES = ("whisper-1",)

# "embedded": the tiny.en model shipped with the app; None: no transcription on this server.
TranscriberChoice = Transcriber | Literal["embedded"] | None
WaitForDisconnect = Callable[[], Awaitable[None]]


def resolve_transcriber(choice: TranscriberChoice) -> Transcriber | None:
    """Constructing a Transcriber only finds its folder and device (~0.1 s); the model loads on first use."""
    if not isinstance(choice, str):
        return choice
    try:
        return Transcriber()
    except (ImportError, OSError, RuntimeError, ValueError) as exc:
        log.warning("audio transcription is off: %s", exc)
        return None


class OpenAIServingTranscription:
    def __init__(
        self,
        transcriber: Transcriber | None,
        created: int,
        max_seconds: float | None = None,
        speech_models: Sequence[SpeechLLMTranscriber] = (),
    ) -> None:
        """`transcriber`: the Whisper model (None: none); `speech_models`: speech LLMs beside it."""
        self.transcriber = transcriber
        self.max_seconds = max_seconds
        self.by_name: dict[str, Transcriber | SpeechLLMTranscriber] = {}
        if transcriber is not None:
            self.by_name.update({name: transcriber for name in (transcriber.model_name, *WHISPER_ALIASES)})
        for model in speech_models:
            self.by_name.setdefault(model.model_name, model)
        self.model_names = list(self.by_name)
        self._created = created

    def model_cards(self) -> list[ModelCard]:
        return [ModelCard(id=name, created=self._created) for name in self.model_names]

    async def create(
        self, form: TranscriptionForm, wait_for_disconnect: WaitForDisconnect
    ) -> Response | ApiError:
        try:
            transcriber = self._check(form)
            transcript = await _transcribe(transcriber, form, wait_for_disconnect, self.max_seconds)
            body = formats.render(transcript, form.response_format, form.granularities)
        except ApiError as error:
            return error
        return Response(body, media_type=formats.MEDIA_TYPES[form.response_format])

    def _check(self, form: TranscriptionForm) -> Transcriber | SpeechLLMTranscriber:
        """Everything that can be refused is refused before the model is touched."""
        if not self.by_name:
            raise ApiError(
                404, "No transcription model is loaded on this server.", param="model", code="model_not_found"
            )
        transcriber = self.by_name.get(form.model)
        if transcriber is None:
            raise model_not_found(form.model, self.model_names)
        try:
            formats.check_request(form.response_format, form.granularities)
        except ValueError as exc:
            unknown_format = str(exc).startswith("unknown response_format")
            param = "response_format" if unknown_format else "timestamp_granularities"
            raise bad_request(_sentence(str(exc)), param=param) from exc
        if form.stream:
            raise bad_request(
                f"Streaming is not supported for {transcriber.model_name}; leave 'stream' unset.",
                param="stream",
            )
        if form.language:
            try:
                formats.language_code(form.language)
            except ValueError as exc:
                raise bad_request(_sentence(str(exc)), param="language") from exc
        name = form.file.filename or "audio"
        if form.file.size == 0:
            raise bad_request(
                f"{name}: the audio file is empty (0 bytes).", param="file", code="invalid_audio"
            )
        return transcriber


async def _transcribe(
    transcriber: Transcriber | SpeechLLMTranscriber,
    form: TranscriptionForm,
    wait_for_disconnect: WaitForDisconnect,
    max_seconds: float | None = None,
) -> Transcript:
    """Runs in a worker thread while the loop watches for the client hanging up."""
    cancelled = threading.Event()
    work = partial(
        transcriber.transcribe,
        form.file.file,
        language=form.language or None,
        prompt=form.prompt or None,
        temperature=form.temperature,
        # word timings cost a second alignment pass: only when a format shows them
        word_timestamps="word" in form.granularities,
        cancel=cancelled.is_set,
        source=form.file.filename or "audio",
        max_seconds=max_seconds,
    )

    async def watch() -> None:
        await wait_for_disconnect()
        cancelled.set()

    def attempt() -> Transcript | Exception:
        # the outcome as a value: an exception raised inside the task group would come out wrapped
        try:
            return work()
        except (AudioError, TranscriptionCancelled, RuntimeError, OSError) as exc:
            return exc

    async with anyio.create_task_group() as group:
        group.start_soon(watch)
        outcome = await anyio.to_thread.run_sync(attempt)
        group.cancel_scope.cancel()
    if isinstance(outcome, Transcript):
        return outcome
    if isinstance(outcome, AudioError):
        raise bad_request(_sentence(str(outcome)), param="file", code="invalid_audio")
    if isinstance(outcome, TranscriptionCancelled):
        raise client_closed("The client disconnected; the transcription was stopped.")
    # the model folder is broken, or CTranslate2 cannot run here
    log.error("transcription with %s failed: %r", transcriber.model_name, outcome)
    raise ApiError(
        503,
        f"The transcription model {transcriber.model_name} cannot run: {outcome}",
        code="model_unavailable",
    )


def _sentence(text: str) -> str:
    return text if text.endswith(".") else text + "."
