"""The Transcribe pane's service: model reuse, progress and cancel, exports; one real run on the fixture clip."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from app.cli import main as paddock
from app.engine.tasks.audio import Segment, Transcript, TranscriptionCancelled, Word
from app.studio.transcription import (
    TranscriptionService,
    export_transcript,
    is_audio_file,
    word_at,
)

SPEECH = Path(__file__).parents[1] / "fixtures" / "audio" / "speech.wav"
CUE_TIME = r"\d\d:\d\d:\d\d[,.]\d\d\d"


def sample_transcript() -> Transcript:
    words = [Word(0.5, 0.9, "Good", 0.9), Word(1.0, 1.6, "morning.", 0.9)]
    return Transcript(
        text="Good morning.",
        language="en",
        duration=2.0,
        segments=[Segment(0, 0.5, 1.6, " Good morning.", words)],
    )


class FakeTranscriber:
    def __init__(self, path: Path | None, device: str) -> None:
        self.path, self.device = path, device
        self.calls: list[dict[str, object]] = []

    def transcribe(self, audio: object, **options: object) -> Transcript:
        self.calls.append({"audio": audio, **options})
        progress = options.get("progress")
        if callable(progress):
            progress(0.0)
            progress(1.0)
        return sample_transcript()


def test_service_builds_the_model_once_and_rebuilds_on_switch(tmp_path: Path) -> None:
    built: list[FakeTranscriber] = []

    def factory(path: Path | None, device: str) -> FakeTranscriber:
        built.append(FakeTranscriber(path, device))
        return built[-1]

    service = TranscriptionService(device="cpu", transcriber_factory=factory)  # type: ignore[arg-type]
    seen: list[float] = []
    result = service.transcribe_file(tmp_path / "a.wav", language="en", progress=seen.append)
    service.transcribe_file(tmp_path / "b.wav")
    assert result.text == "Good morning." and seen == [0.0, 1.0]
    assert len(built) == 1 and built[0].device == "cpu" and built[0].path is None
    assert built[0].calls[0]["language"] == "en" and built[0].calls[0]["word_timestamps"] is True
    service.set_model(tmp_path / "whisper-small")
    service.transcribe_file(tmp_path / "c.wav")
    assert len(built) == 2 and built[1].path == tmp_path / "whisper-small"


def test_cancel_before_start_never_loads_the_model() -> None:
    def factory(path: Path | None, device: str) -> FakeTranscriber:
        raise AssertionError("the model should not load")

    service = TranscriptionService(transcriber_factory=factory)  # type: ignore[arg-type]
    with pytest.raises(TranscriptionCancelled, match="before it started"):
        service.transcribe_file(SPEECH, cancel=lambda: True)


def test_exports_by_suffix(tmp_path: Path) -> None:
    transcript = sample_transcript()
    assert export_transcript(transcript, tmp_path / "t.txt").read_text() == "Good morning.\n"
    assert (
        export_transcript(transcript, tmp_path / "t.srt").read_text()
        == "1\n00:00:00,500 --> 00:00:01,600\nGood morning.\n\n"
    )
    assert export_transcript(transcript, tmp_path / "t.vtt").read_text().startswith("WEBVTT\n\n00:00:00.500")
    exported = json.loads(export_transcript(transcript, tmp_path / "t.json").read_text())
    assert exported["words"][1] == {"word": "morning.", "start": 1.0, "end": 1.6}
    assert exported["segments"][0]["text"] == " Good morning."
    assert export_transcript(transcript, tmp_path / "plain.dat", "text").read_text() == "Good morning.\n"
    with pytest.raises(
        ValueError, match=r"cannot tell the export format from 'notes\.doc'; use one of \.json"
    ):
        export_transcript(transcript, tmp_path / "notes.doc")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.dat", "t.json", "t.srt", "t.txt", "t.vtt"]


def test_word_at_and_audio_suffixes() -> None:
    transcript = sample_transcript()
    assert word_at(transcript, 0.6) == Word(0.5, 0.9, "Good", 0.9)
    assert word_at(transcript, 0.95) is None
    assert word_at(transcript, 1.2).word == "morning."  # type: ignore[union-attr]
    assert is_audio_file("Meeting.MP3") and is_audio_file(Path("x.wav")) and not is_audio_file("notes.pdf")


def test_real_transcription_exported_as_subtitles(tmp_path: Path) -> None:
    service = TranscriptionService(device="cpu")
    transcript = service.transcribe_file(SPEECH)
    assert "quick brown fox" in transcript.text.lower()
    srt = export_transcript(transcript, tmp_path / "speech.srt").read_text()
    cues = srt.strip().split("\n\n")
    assert len(cues) == len(transcript.segments)
    for number, cue in enumerate(cues, start=1):
        index, timing, text = cue.split("\n", 2)
        assert index == str(number) and re.fullmatch(f"{CUE_TIME} --> {CUE_TIME}", timing) and text.strip()
    vtt = export_transcript(transcript, tmp_path / "speech.vtt").read_text()
    assert vtt.startswith("WEBVTT\n\n") and "garden" in vtt


def test_transcribe_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "speech.vtt"
    assert (
        paddock(["transcribe", str(SPEECH), "--format", "vtt", "--device", "cpu", "--output", str(out)]) == 0
    )
    assert out.read_text().startswith("WEBVTT\n\n00:00:00.000 --> ") and "lazy dog" in out.read_text()
    empty = tmp_path / "empty.wav"
    empty.touch()
    assert paddock(["transcribe", str(empty), "--device", "cpu"]) == 1
    assert "empty.wav: the audio file is empty" in capsys.readouterr().err
