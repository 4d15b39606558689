"""Audio decoding under limits (issue 24): past `max_seconds` decoding stops while it runs, so a long or
noise upload is refused with bounded memory; a cancel stops it too; within the limits the samples are
faster-whisper's own decoder's."""

from __future__ import annotations

import struct
import tracemalloc
import wave
from pathlib import Path

import numpy as np
import pytest

from app.engine.tasks.audio import SAMPLE_RATE, AudioError, TranscriptionCancelled, decode_audio

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
