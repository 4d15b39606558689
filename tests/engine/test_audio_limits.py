"""Audio decoding under limits (issue 24): past `max_seconds` decoding stops while it runs, so a long or
noise upload is refused with bounded memory; a cancel stops it too; within the limits the samples are
faster-whisper's own decoder's."""

from __future__ import annotations

import struct
import tracemalloc
import wave
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from app.engine.tasks.audio import (
    SAMPLE_RATE,
    WINDOW_SECONDS,
    AudioError,
    Transcriber,
    TranscriptionCancelled,
    decode_audio,
)

SPEECH = Path(__file__).parents[1] / "fixtures" / "audio" / "speech.wav"
LONG_SECONDS = 300


def write_noise(path: Path, seconds: int, rate: int = SAMPLE_RATE, channels: int = 1) -> Path:
    samples = np.random.default_rng(0).integers(-8000, 8000, size=seconds * rate * channels, dtype=np.int16)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(samples.tobytes())
    return path


@pytest.mark.parametrize("make", ["speech", "noise 22.05 kHz stereo"])
def test_samples_match_faster_whispers_decoder(tmp_path, make):
    from faster_whisper import decode_audio as reference

    path = SPEECH if make == "speech" else write_noise(tmp_path / "n.wav", 3, rate=22_050, channels=2)
    ours = decode_audio(path, max_seconds=60)
    theirs = reference(str(path), sampling_rate=SAMPLE_RATE)
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, atol=2 / 32768)


def test_audio_past_the_limit_is_refused_while_decoding_with_bounded_memory(tmp_path):
    path = write_noise(tmp_path / "long.wav", LONG_SECONDS)
    whole = LONG_SECONDS * SAMPLE_RATE * (2 + 4)  # int16 decoded, then float32: what a full decode holds
    tracemalloc.start()
    try:
        with pytest.raises(AudioError, match="longer than the 2 s allowed"):
            decode_audio(path, max_seconds=2)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < whole / 20, peak


def test_a_cancel_stops_decoding(tmp_path):
    path = write_noise(tmp_path / "long.wav", LONG_SECONDS)
    checks = []

    def cancel() -> bool:
        checks.append(1)
        return len(checks) > 3

    with pytest.raises(TranscriptionCancelled):
        decode_audio(path, cancel=cancel)
    assert len(checks) == 4  # it stopped at the first check that said so


def riff_wav(
    rate: int = SAMPLE_RATE, channels: int = 1, bits: int = 16, codec: int = 1, data: bytes = b"\0" * 2000
) -> bytes:
    """A WAV whose header says whatever it is told (`wave` refuses to write the absurd ones)."""
    block = (channels * bits // 8) & 0xFFFF
    fmt = struct.pack("<HHIIHH", codec, channels, rate, (rate * block) & 0xFFFFFFFF, block, bits)
    body = (
        b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    )
    return b"RIFF" + struct.pack("<I", len(body)) + body


# (name, bytes, words the 400 names): issue 40's 2**31 Hz WAV made PyAV raise a MemoryError subclass
MALFORMED_AUDIO = [
    ("rate 2**31-1", riff_wav(rate=2**31 - 1), "sample rate of 2147483647 Hz"),
    ("rate 2**31-1 float", riff_wav(rate=2**31 - 1, codec=3, bits=32), "sample rate of 2147483647 Hz"),
    ("rate 800 kHz", riff_wav(rate=800_000), "sample rate of 800000 Hz"),
    ("rate 1 Hz", riff_wav(rate=1), "sample rate of 1 Hz"),
    ("rate 0", riff_wav(rate=0), "cannot decode"),
    ("0 channels", riff_wav(channels=0), "0 channels"),
    ("0 bits", riff_wav(bits=0), "cannot decode"),
    ("unknown codec", riff_wav(codec=0x1234), "cannot decode"),
    ("header cut", riff_wav()[:30], "cannot decode"),
    ("RIFF only", b"RIFF", "cannot decode"),
    ("random bytes", np.random.default_rng(1).bytes(4000), "cannot decode"),
    ("MP3 tag, no frames", b"ID3\x03" + bytes(6) + np.random.default_rng(2).bytes(3000), "cannot decode"),
    ("Ogg magic, noise", b"OggS" + np.random.default_rng(3).bytes(3000), "cannot decode"),
    ("FLAC magic, noise", b"fLaC" + np.random.default_rng(4).bytes(3000), "cannot decode"),
]


@pytest.mark.parametrize(
    ("name", "data", "words"), MALFORMED_AUDIO, ids=[case[0] for case in MALFORMED_AUDIO]
)
def test_malformed_audio_is_an_audio_error_naming_the_problem(name, data, words):
    with pytest.raises(AudioError) as caught:
        decode_audio(data, "clip.wav", max_seconds=7200)
    assert str(caught.value).startswith("clip.wav: ") and words in str(caught.value)


class FakeWhisper:
    """Stands in for faster-whisper's model: one segment per 30 s of each array it is given, made only
    when the caller asks for the next one (faster-whisper's segments are a generator too)."""

    def __init__(self) -> None:
        self.given: list[int] = []  # samples of each transcribe() call
        self.segments_made = 0

    def transcribe(
        self, samples: np.ndarray, **options: object
    ) -> tuple[Iterator[SimpleNamespace], SimpleNamespace]:
        self.given.append(samples.size)
        step = 30 * SAMPLE_RATE

        def segments() -> Iterator[SimpleNamespace]:
            for start in range(0, samples.size, step):
                self.segments_made += 1
                end = min(start + step, samples.size)
                yield SimpleNamespace(
                    start=start / SAMPLE_RATE, end=end / SAMPLE_RATE, text=" x", words=[], seek=start // 160,
                    tokens=[1], temperature=0.0, avg_logprob=-0.1, compression_ratio=1.0, no_speech_prob=0.0,
                )  # fmt: skip

        return segments(), SimpleNamespace(language="en")


@pytest.fixture
def fake_whisper(tmp_path: Path) -> tuple[Transcriber, FakeWhisper]:
    (tmp_path / "model.bin").write_bytes(b"")
    transcriber = Transcriber(tmp_path, device="cpu")
    model = FakeWhisper()
    transcriber._model = model  # type: ignore[assignment]
    return transcriber, model


def test_whisper_gets_the_audio_a_window_at_a_time_with_times_in_the_whole(tmp_path, fake_whisper):
    """Issue 40: an 82-minute upload went to Whisper as one array (+4.3 GB for its features at once)."""
    transcriber, model = fake_whisper
    seconds = 2 * WINDOW_SECONDS + 120
    transcript = transcriber.transcribe(write_noise(tmp_path / "long.wav", seconds), word_timestamps=False)
    assert model.given == [WINDOW_SECONDS * SAMPLE_RATE] * 2 + [120 * SAMPLE_RATE]
    starts = [segment.start for segment in transcript.segments]
    assert starts == [30.0 * i for i in range(seconds // 30)]  # each window's times placed in the whole
    assert transcript.segments[-1].end == transcript.duration == seconds
    assert [segment.id for segment in transcript.segments] == list(range(seconds // 30))


def test_a_cancel_stops_whisper_at_the_next_segment(tmp_path, fake_whisper):
    """The cancel is seen after each segment (30 s of audio): nothing more is decoded once it turns true."""
    transcriber, model = fake_whisper
    path = write_noise(tmp_path / "long.wav", 2 * WINDOW_SECONDS)
    with pytest.raises(TranscriptionCancelled, match=r"at 30\.0 s of 600\.0 s"):
        transcriber.transcribe(path, cancel=lambda: model.segments_made >= 1)
    assert model.segments_made == 1 and len(model.given) == 1


def test_a_cancel_is_seen_inside_a_segment_before_each_model_step():
    """Between segments is not enough: one segment of noise is up to six decodes (temperature
    fallbacks); the real model's encoder and decoder steps each look at the cancel first."""
    transcriber = Transcriber(device="cpu")
    # false while decoding and before the model loads; true from the model's first step on
    with pytest.raises(TranscriptionCancelled, match="before the model's encode step"):
        transcriber.transcribe(SPEECH, cancel=lambda: transcriber.loaded)
    transcript = transcriber.transcribe(SPEECH)  # the shared model is unharmed, and unchecked without a cancel
    assert "fox" in transcript.text.lower()
