"""The Transcribe pane: the committed espeak-ng clip dropped on it and transcribed by the embedded tiny.en,
reading along by time, exports, cancel, and the errors a user sees for files it cannot use."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QTextCursor

from app.studio.tasks import ThreadExecutor
from app.studio.transcription import Transcript, TranscriptionCancelled, TranscriptionService
from app.ui.panes.transcribe import TranscribePane, clock
from app.ui.workers import UiBridge, Worker

from .drag import drop

SPEECH = Path(__file__).parents[1] / "fixtures" / "audio" / "speech.wav"
WAIT_MS = 120_000  # loading and running tiny.en on shared CPUs
SPOKEN = ["quick", "brown", "fox", "over", "lazy", "dog", "water", "garden"]  # tiny.en hears "jumps" as "jump"


def transcribe(qtbot, pane: TranscribePane, path: Path):
    with qtbot.waitSignal(pane.transcription_finished, timeout=WAIT_MS) as outcome:
        drop(pane.drop_zone, [path])
    return outcome.args[0]


@pytest.fixture
def window(qtbot, make_window):
    window = make_window(panes=("transcribe",))
    window.show()  # clicks on words need the transcript laid out on a screen
    qtbot.waitExposed(window)
    return window


@pytest.fixture
def transcribed(qtbot, window):
    """The Transcribe pane after speech.wav was dropped on it (tiny.en on the CPU)."""
    pane = window.pane("transcribe")
    result = transcribe(qtbot, pane, SPEECH)
    assert result.ok, result.error_message
    return pane


def words_of(transcript: Transcript) -> list[str]:
    return [re.sub(r"\W", "", word.word).lower() for word in transcript.words]


def test_a_dropped_clip_is_transcribed_word_by_word_with_rising_times(transcribed):
    pane = transcribed
    transcript = pane.result.transcript
    spoken = words_of(transcript)
    assert all(word in spoken for word in SPOKEN)
    starts = [word.start for word in transcript.words]
    assert starts == sorted(starts) and all(w.start <= w.end <= transcript.duration for w in transcript.words)
    assert pane.segments.count() == len(transcript.segments) >= 1
    first = transcript.segments[0]
    assert pane.segments.item(0).text().startswith(f"{clock(first.start)} → {clock(first.end)}")
    assert "quick brown fox" in pane.words.toPlainText().lower()
    assert re.match(r"speech.wav: 5.1 s of audio in [\d.]+ s · 13 words · language en$", pane.progress_label.text())
    assert pane.model_label.text() == "Model: whisper-tiny.en · Device: CPU (int8) · loaded"
    assert pane.error.isHidden() and pane.progress.isHidden()
    assert all(button.isEnabled() for button in pane.export_buttons.values())


def test_segments_words_and_the_position_slider_follow_each_other(qtbot, transcribed):
    pane = transcribed
    transcript = pane.result.transcript
    fox = words_of(transcript).index("fox")
    word = transcript.words[fox]
    pane.position.setValue(round((word.start + word.end) / 2 * 1000))  # the middle of "fox"
    assert pane.words.highlighted == fox
    assert pane.position_label.text().endswith(f" / {clock(transcript.duration)}")
    last = len(transcript.segments) - 1
    item = pane.segments.item(last)  # a click on the last segment shows its time
    qtbot.mouseClick(pane.segments.viewport(), Qt.MouseButton.LeftButton,
                     pos=pane.segments.visualItemRect(item).center())
    segment = transcript.segments[last]
    assert pane.selection_label.text() == f"Segment {last + 1}: {clock(segment.start)} → {clock(segment.end)}"
    assert pane.position.value() == round(segment.start * 1000)
    garden = words_of(transcript).index("garden")  # a click on a word in the transcript
    cursor = QTextCursor(pane.words.document())
    cursor.setPosition(pane.words._starts[garden] + 1)
    point: QPoint = pane.words.cursorRect(cursor).center()
    qtbot.mouseClick(pane.words.viewport(), Qt.MouseButton.LeftButton, pos=point)
    target = transcript.words[garden]
    assert pane.selection_label.text() == f"“{target.word}”: {clock(target.start)} → {clock(target.end)}"
    assert pane.words.highlighted == garden and pane.position.value() == round(target.start * 1000)


def test_exports_write_txt_srt_and_vtt_where_the_dialog_says(qtbot, window, transcribed, tmp_path):
    pane = transcribed
    transcript = pane.result.transcript
    dialogs = window.context.dialogs
    contents = {}
    for suffix in (".txt", ".srt", ".vtt"):
        dialogs.save_to = str(tmp_path / f"out{suffix}")
        qtbot.mouseClick(pane.export_buttons[suffix], Qt.MouseButton.LeftButton)
        contents[suffix] = Path(dialogs.save_to).read_text(encoding="utf-8")
        assert pane.selection_label.text() == f"Saved {dialogs.save_to}"
    assert contents[".txt"] == transcript.text + "\n"
    cue = r"\d\d:\d\d:\d\d{sep}\d\d\d --> \d\d:\d\d:\d\d{sep}\d\d\d"
    assert re.match(rf"1\n{cue.format(sep=',')}\n", contents[".srt"])
    assert re.match(rf"WEBVTT\n\n{cue.format(sep='[.]')}\n", contents[".vtt"])
    for text in contents.values():
        assert "quick brown fox" in text.lower()
    assert dialogs.asked[-1] == "Export the transcript as VTT"
    dialogs.save_to = None  # the dialog cancelled: nothing written, nothing said
    assert pane.export(".srt") is None


def test_an_empty_file_and_a_document_get_readable_errors(qtbot, window, tmp_path):
    pane = window.pane("transcribe")
    empty = tmp_path / "meeting.wav"
    empty.write_bytes(b"")
    result = transcribe(qtbot, pane, empty)
    assert result.error is not None
    assert pane.error.text() == "meeting.wav: the audio file is empty (0 bytes)"
    assert not pane.error.isHidden() and pane.result is None
    notes = tmp_path / "notes.pdf"
    notes.write_bytes(b"%PDF-1.4")
    drop(pane.words.viewport(), [notes])  # dropped on the transcript, not the box; refused at once
    assert pane.error.text().startswith("notes.pdf is not an audio file") and not pane.busy
    assert not any(button.isEnabled() for button in pane.export_buttons.values())


class SlowTranscriber:
    """Stands in for Whisper: reports progress in small steps until cancelled."""

    model_name, device, compute_type, loaded = "slow-fake", "cpu", "int8", True

    def __init__(self) -> None:
        self.running = threading.Event()

    def transcribe(self, audio, progress=None, cancel=None, **options) -> Transcript:
        for step in range(1000):
            self.running.set()
            progress(step / 1000)
            if cancel():
                raise TranscriptionCancelled(f"cancelled at step {step}")
            time.sleep(0.005)
        raise AssertionError("the job was never cancelled")


def test_cancel_stops_the_transcription(qtbot, make_context):
    fake = SlowTranscriber()
    service = TranscriptionService(transcriber_factory=lambda path, device: fake)
    context = make_context()
    worker = Worker(UiBridge(), ThreadExecutor(max_workers=1))
    pane = TranscribePane(service, worker, context.dialogs)
    qtbot.addWidget(pane)
    pane.show()
    with qtbot.waitSignal(pane.transcription_finished, timeout=WAIT_MS) as outcome:
        drop(pane.drop_zone, [SPEECH])
        qtbot.waitUntil(lambda: fake.running.is_set() and pane.progress.value() > 0, timeout=WAIT_MS)
        assert pane.cancel_button.isVisible() and not pane.drop_zone.isEnabled()
        qtbot.mouseClick(pane.cancel_button, Qt.MouseButton.LeftButton)
    assert outcome.args[0].cancelled
    assert pane.progress_label.text() == "Cancelled." and not pane.progress.isVisible()
    assert pane.drop_zone.isEnabled() and pane.result is None
    assert pane.model_label.text() == "Model: slow-fake · Device: CPU (int8) · loaded"
    worker.shutdown()


def test_a_corrupt_file_is_explained_in_words_and_the_transcript_stays(qtbot, transcribed, tmp_path):
    pane = transcribed
    kept = pane.words.toPlainText()
    broken = tmp_path / "broken.wav"
    broken.write_bytes(b"RIFF" + bytes(range(256)) * 4)  # a WAV name, not WAV data
    result = transcribe(qtbot, pane, broken)
    assert not result.ok
    message = pane.error.text()
    assert "broken.wav" in message and "Errno" not in message and "1094995529" not in message
    assert "damaged" in message
    assert pane.words.toPlainText() == kept and pane.result is not None  # the earlier transcript is kept


def test_without_playback_the_position_slider_is_hidden(window):
    from app.ui.panes import transcribe as module

    pane = window.pane("transcribe")
    assert pane.position_row.isVisibleTo(pane) == module.HAS_PLAYBACK
