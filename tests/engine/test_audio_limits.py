"""Audio decoding under limits (issue 24): past `max_seconds` decoding stops while it runs, so a long or
noise upload is refused with bounded memory; a cancel stops it too; within the limits the samples are
faster-whisper's own decoder's."""

from __future__ import annotations

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
