"""The Transcribe pane with a Qwen3-ASR folder chosen through its "Choose model…" button: the speech LLM
(the tiny random-weight fixture of tests/fixtures/qwen3_asr) replaces Whisper for the next drops, and its
transcript shows as one segment over the clip (the model gives no timestamps)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt

from .drag import drop

FIXTURES = Path(__file__).parents[1] / "fixtures"
ASR = FIXTURES / "qwen3_asr" / "hf"
SPEECH = FIXTURES / "audio" / "speech.wav"
WAIT_MS = 60_000


def test_a_chosen_qwen3_asr_folder_transcribes_the_next_drop(qtbot, make_window, tmp_path):
    window = make_window(panes=("transcribe",))
    pane = window.pane("transcribe")
    pane.dialogs.folder_answer = None  # cancelled: nothing changes
    qtbot.mouseClick(pane.model_button, Qt.MouseButton.LeftButton)
    assert pane.service.model_path is None
    pane.dialogs.folder_answer = str(ASR)
    qtbot.mouseClick(pane.model_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: pane.model_label.text().startswith("Model: hf · Device: CPU"), timeout=WAIT_MS)
    assert pane.model_label.text().endswith("· loaded") and pane.service.model_path == ASR
    with qtbot.waitSignal(pane.transcription_finished, timeout=WAIT_MS) as outcome:
        drop(pane.drop_zone, [SPEECH])
    result = outcome.args[0]
    assert result.ok, result.error_message
    transcript = result.value.transcript
    assert [(s.start, s.end) for s in transcript.segments] == [(0.0, transcript.duration)]
    assert pane.segments.count() == 1 and abs(transcript.duration - 82096 / 16_000) < 1e-3


def test_a_folder_that_is_no_model_says_why(qtbot, make_window, tmp_path):
    window = make_window(panes=("transcribe",))
    pane = window.pane("transcribe")
    pane.dialogs.folder_answer = str(tmp_path)
    qtbot.mouseClick(pane.model_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "not available" in pane.model_label.text(), timeout=WAIT_MS)
    assert f"{tmp_path} is not a CTranslate2 Whisper model folder" in pane.model_label.text()
