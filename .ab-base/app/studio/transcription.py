"""The Transcribe pane's service: one shared speech model, jobs with progress and cancel, export.

The model is a Whisper folder (faster-whisper; the embedded tiny.en by default) or a speech LLM's folder
(Qwen3-ASR, Granite Speech, or Gemma 4 with an audio tower: run on the engine, tasks/speech_llm.py), told
apart by the folder's config.json.

Jobs run synchronously in the calling thread; the Studio's task runner puts them on a worker
and passes its cancel check and a progress callback through. The model loads on the first job
and is reused until another model is chosen.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from app.engine.tasks import transcript_formats as formats
from app.engine.tasks.audio import (
    AudioError,
    CancelCheck,
    ProgressCallback,
    Transcriber,
    Transcript,
    TranscriptionCancelled,
    Word,
)

__all__ = [
    "AUDIO_EXTENSIONS",
    "EXPORT_FORMATS",
    "AudioError",
    "TranscriptionCancelled",
    "TranscriptionService",
    "export_transcript",
    "is_audio_file",
    "word_at",
]

# What the pane accepts on drop; FFmpeg reads more, but these are what people drag in.
_AUDIO_SUFFIXES = ".wav .mp3 .m4a .mp4 .mpeg .mpga .ogg .oga .opus .flac .webm .aac .wma .mkv .mov"
AUDIO_EXTENSIONS = frozenset(_AUDIO_SUFFIXES.split())
# Export file suffix -> response format; JSON exports carry both segment and word timestamps.
EXPORT_FORMATS = {".txt": "text", ".srt": "srt", ".vtt": "vtt", ".json": "verbose_json"}


def is_audio_file(path: str | Path) -> bool:
    return Path(path).suffix.lower() in AUDIO_EXTENSIONS


class TranscriptionService:
    def __init__(
        self,
        model_path: str | Path | None = None,
        device: str = "auto",
        transcriber_factory: Callable[[Path | None, str], Transcriber] | None = None,
    ) -> None:
        """`transcriber_factory(model_path, device)` builds the model wrapper (tests pass a fake)."""
        self._factory = transcriber_factory or _speech_model
        self._model_path = Path(model_path) if model_path is not None else None
        self._device = device
        self._transcriber: Transcriber | None = None
        self._lock = threading.Lock()

    @property
    def model_path(self) -> Path | None:
        """The chosen model folder; None means the embedded tiny.en."""
        return self._model_path

    def set_model(self, model_path: str | Path | None, device: str | None = None) -> None:
        """Switch to another CTranslate2 Whisper folder (e.g. a downloaded larger model) or a speech LLM's folder."""
        with self._lock:
            self._model_path = Path(model_path) if model_path is not None else None
            self._device = device or self._device
            self._transcriber = None

    def transcriber(self) -> Transcriber:
        with self._lock:
            if self._transcriber is None:
                self._transcriber = self._factory(self._model_path, self._device)
            return self._transcriber

    def transcribe_file(
        self,
        path: str | Path,
        language: str | None = None,
        prompt: str | None = None,
        progress: ProgressCallback | None = None,
        cancel: CancelCheck | None = None,
    ) -> Transcript:
        """Transcribe one file with word timestamps.

        `progress(fraction)` runs in this thread; `cancel()` is checked before the model loads
        and between segments, and raises TranscriptionCancelled. Bad audio raises AudioError.
        """
        path = Path(path)
        if cancel is not None and cancel():
            raise TranscriptionCancelled("transcription cancelled before it started")
        transcriber = self.transcriber()
        try:
            return transcriber.transcribe(
                path, language=language, prompt=prompt, word_timestamps=True, progress=progress, cancel=cancel
            )
        except AudioError as exc:
            raise AudioError(exc.source, readable_audio_error(exc.problem, path)) from exc


def _speech_model(path: Path | None, device: str) -> Transcriber:
    """A speech LLM folder (Qwen3-ASR, Granite Speech, Gemma 4 with audio) loaded now, any other as a Whisper
    model (loaded on first use)."""
    from app.engine.tasks.speech_llm import (  # the engine: on demand
        SpeechLLMTranscriber,
        is_speech_llm_folder,
    )

    if path is not None and is_speech_llm_folder(path):
        return SpeechLLMTranscriber.load(path, device=device)  # type: ignore[return-value]  # same calls
    return Transcriber(model_path=path, device=device)


_ERRNO = re.compile(r"\[Errno -?\d+\]\s*")


def readable_audio_error(message: str, path: Path) -> str:
    """The decoder's message in words: no "[Errno 1094995529]", no repeated path, and what it means."""
    text = _ERRNO.sub("", message).replace(f": '{path}'", "").replace(f": {path}", "")
    if "Invalid data" in text:
        text = text.rstrip(".") + ". The file is damaged, or is not really the audio format its name says."
    return text


def export_transcript(transcript: Transcript, path: str | Path, response_format: str | None = None) -> Path:
    """Write a transcript as TXT, SRT, VTT or JSON, chosen by `response_format` or the file suffix.

    The file is written to a temporary name and renamed, so a failed export never leaves half a file.
    """
    path = Path(path)
    if response_format is None:
        response_format = EXPORT_FORMATS.get(path.suffix.lower())
        if response_format is None:
            choices = ", ".join(sorted(EXPORT_FORMATS))
            raise ValueError(f"cannot tell the export format from {path.name!r}; use one of {choices}")
    granularities = ("segment", "word") if response_format == "verbose_json" else ()
    body = formats.render(transcript, response_format, granularities)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="\n") as out:
            out.write(body)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def word_at(transcript: Transcript, seconds: float) -> Word | None:
    """The word being spoken at `seconds` (for highlighting during playback), or None in a pause."""
    for word in transcript.words:
        if word.start <= seconds < word.end:
            return word
    return None
