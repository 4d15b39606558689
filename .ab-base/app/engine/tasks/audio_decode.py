"""Audio in, 16 kHz mono samples out, for Whisper: any format FFmpeg reads, through PyAV.

Empty, undecodable or malformed input fails with an AudioError naming the file and the problem before
any model is touched; a stream header declaring absurd sizes is refused before FFmpeg allocates for it.
Decoding stops as soon as `max_seconds` is passed, and `cancel()` is checked as frames come. The
samples stay as the int16 chunks FFmpeg gave (`Pcm`, 2 bytes a sample); the transcriber takes them a
window at a time as float32, so an hour of audio is never held as one float array.
"""

from __future__ import annotations

import io
import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

SAMPLE_RATE = 16_000  # Whisper's input rate; decoding resamples to it
AudioInput = str | os.PathLike[str] | bytes | bytearray | BinaryIO
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
class Pcm:
    """Decoded audio: 16 kHz mono int16 chunks, in order, never joined whole."""

    chunks: list[np.ndarray]

    @cached_property
    def size(self) -> int:
        return sum(chunk.size for chunk in self.chunks)

    @property
    def seconds(self) -> float:
        return self.size / SAMPLE_RATE

    def windows(self, samples: int) -> Iterator[tuple[int, np.ndarray]]:
        """(first sample, float32 samples) of consecutive windows of at most `samples` samples."""
        pending: list[np.ndarray] = []
        held = start = 0
        for chunk in self.chunks:
            pending.append(chunk)
            held += chunk.size
            while held >= samples:
                joined = np.concatenate(pending)
                yield start, _as_float(joined[:samples])
                rest = joined[samples:]
                pending, held, start = [rest], rest.size, start + samples
        if held:
            yield start, _as_float(np.concatenate(pending))

    def whole(self) -> np.ndarray:
        return _as_float(np.concatenate(self.chunks)) if self.chunks else np.zeros(0, np.float32)


def _as_float(samples: np.ndarray) -> np.ndarray:
    return samples.astype(np.float32) / 32768.0


def decode_audio(
    audio: AudioInput,
    source: str | None = None,
    max_seconds: float | None = None,
    cancel: CancelCheck | None = None,
) -> np.ndarray:
    """Any format FFmpeg reads -> float32 mono samples at 16 kHz, whole. Raises AudioError."""
    return decode_pcm(audio, source, max_seconds, cancel).whole()


def decode_pcm(
    audio: AudioInput,
    source: str | None = None,
    max_seconds: float | None = None,
    cancel: CancelCheck | None = None,
) -> Pcm:
    """Any format FFmpeg reads -> 16 kHz mono int16 chunks. Raises AudioError.

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
    pcm = Pcm(chunks)
    if pcm.size == 0:
        raise AudioError(source, "the audio contains no samples")
    return pcm


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


def describe_audio(audio: AudioInput) -> str:
    if isinstance(audio, str | os.PathLike):
        return Path(audio).name
    name = getattr(audio, "name", None)
    return Path(name).name if isinstance(name, str) and name else "audio"
